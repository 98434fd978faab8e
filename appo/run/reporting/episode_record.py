"""Each policy's last --stats_avg episodes, kept in <exp_dir>/episodes.json so that a resumed run starts with them.

A run's final mean reward is the mean of its last --stats_avg episodes (the status line, `final_stats`, CleanRL's
measure in scripts/benchmark.py). Without this file a resumed run would start with an empty window, and a run
resumed shortly before its budget would end on the mean of a few episodes. Rewards and lengths only: PBT's
objectives and the env's extra stats start afresh (an objective is judged on episodes of the weights it ranks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from appo.run.reporting.tally import EpisodeWindow
from appo.utils.files import atomic_write_text
from appo.utils.logs import log

FILE_NAME = "episodes.json"


def save_windows(exp_dir: str, windows: Sequence[EpisodeWindow]) -> None:
    """Write every policy's window (raises OSError: the caller says it)."""
    record = {"policies": [{"total": w.total, "recent": [[reward, length] for reward, length in w.recent]}
                           for w in windows]}
    atomic_write_text(os.path.join(exp_dir, FILE_NAME), json.dumps(record))


def restore_windows(exp_dir: str, windows: Sequence[EpisodeWindow]) -> int:
    """Fill the windows of the policies the file has (a window keeps its newest --stats_avg episodes); returns how
    many episodes were restored. A missing file restores none; a damaged one is said in one line."""
    path = os.path.join(exp_dir, FILE_NAME)
    if not os.path.exists(path):
        return 0
    try:
        with open(path) as f:
            policies = json.load(f)["policies"]
        restored = 0
        for window, saved in zip(windows, policies):
            window.total = int(saved["total"])
            for reward, length in saved["recent"]:
                window.recent.append((float(reward), int(length)))
                restored += 1
        return restored
    except (OSError, ValueError, KeyError, TypeError) as exc:
        for window in windows:
            window.recent.clear()
            window.total = 0
        log.warning("The last episodes of the resumed run are not restored: %s is damaged (%s); the episode means "
                    "start from this run's episodes", path, exc)
        return 0
