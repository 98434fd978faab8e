"""<exp_dir>/tracking.json: the tracker runs of an experiment (W&B's run id, MLflow's run id and store), so that a
resumed run, and `appo.enjoy --save_video`, find the same tracker run again."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from appo.utils.files import atomic_write_text

TRACKING_FILE = "tracking.json"
_lock = threading.Lock()  # the trackers' threads each write their entry


def tracker_runs(exp_dir: str) -> dict[str, dict[str, Any]]:
    """tracker name -> what it saved; {} without the file, or with one that is not a JSON object (the trackers then
    open new runs and write it again)."""
    try:
        with open(os.path.join(exp_dir, TRACKING_FILE)) as f:
            runs = json.load(f)
    except (OSError, ValueError):
        return {}
    return runs if isinstance(runs, dict) else {}


def tracker_run(exp_dir: str, tracker: str) -> dict[str, Any]:
    """What `tracker` saved, {} if nothing."""
    run = tracker_runs(exp_dir).get(tracker)
    return run if isinstance(run, dict) else {}


def remember_run(exp_dir: str, tracker: str, run: dict[str, Any]) -> None:
    """Save `run` as the tracker's entry, atomically: a crash leaves the old file or the new one."""
    with _lock:
        runs = tracker_runs(exp_dir)
        runs[tracker] = run
        atomic_write_text(os.path.join(exp_dir, TRACKING_FILE), json.dumps(runs, indent=2, sort_keys=True) + "\n")
