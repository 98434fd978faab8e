"""Checkpoint files: `checkpoint_p<policy>/checkpoint_<version>_<env_steps>.pth`, written atomically.

A checkpoint is written to a temporary name and renamed into place, so it is either complete or
absent; a disk that fills up or fails can still leave a damaged one. `latest_intact_checkpoint` checks
archive structure and CRCs without importing torch and moves damaged files aside, so a resumed run
starts from the newest checkpoint that loads instead of stopping. Weights that are not finite are never
written: a run that diverged keeps its last good checkpoints.

Writes only inside `checkpoint_p<policy>/` (the learner its rolling checkpoints, the evaluator `best.pth` and
`best.json`). torch is imported only where a checkpoint is saved or loaded, so the runner lists and checks
checkpoints without it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import zipfile
from typing import Any

from appo.utils.files import atomic_write, atomic_write_text
from appo.utils.logs import log

_NAME = re.compile(r"checkpoint_(\d+)_(\d+)\.pth$")
# The best evaluated weights of a policy (appo/learning/evaluator.py), beside its rolling checkpoints, never rotated.
BEST_NAME = "best.pth"


def checkpoint_dir(exp_dir: str, policy_id: int) -> str:
    """`checkpoint_p<policy>/` of an experiment: the policy's rolling checkpoints and its best one."""
    return os.path.join(exp_dir, f"checkpoint_p{policy_id}")


def list_checkpoints(directory: str) -> list[str]:
    """Complete checkpoints, oldest first (by policy version)."""
    paths = [p for p in glob.glob(os.path.join(directory, "checkpoint_*.pth")) if _NAME.search(p)]
    return sorted(paths, key=lambda p: int(_NAME.search(p).group(1)))


def latest_checkpoint(directory: str) -> str | None:
    paths = list_checkpoints(directory)
    return paths[-1] if paths else None


def newest_checkpoints(exp_dir: str, num_policies: int) -> list[str | None]:
    """Each policy's newest checkpoint (None for a policy without one)."""
    return [latest_checkpoint(checkpoint_dir(exp_dir, p)) for p in range(num_policies)]


def parse_name(path: str) -> tuple[int, int]:
    """(policy version, env steps) encoded in a checkpoint's file name."""
    match = _NAME.search(path)
    if match is None:
        raise ValueError(f"not a checkpoint file name: {path}")
    return int(match.group(1)), int(match.group(2))


def free_path(path: str) -> str:
    """`path`, or `path_1`, `path_2`, ... whichever is free first: moving something aside never replaces what
    an earlier move kept."""
    candidate, n = path, 0
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{path}_{n}"
    return candidate


def _damage(path: str) -> str | None:
    """Why `path` cannot be a checkpoint (unreadable, not a zip archive, a bad CRC, no pickle), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            names = archive.namelist()
    except Exception as exc:  # whatever stops zipfile reading it would stop torch.load too
        return f"{type(exc).__name__}: {exc}"
    if bad is not None:
        return f"bad CRC in {bad}"
    if not any(name.endswith("data.pkl") for name in names):
        return "no data.pkl in the archive"
    return None


def latest_intact_checkpoint(directory: str) -> str | None:
    """The newest checkpoint in `directory` that is intact, or None. Damaged newer ones are renamed to
    `<name>.corrupt` (one warning each), so neither this nor the keep-N rotation ever sees them again."""
    for path in reversed(list_checkpoints(directory)):
        damage = _damage(path)
        if damage is None:
            return path
        aside = free_path(f"{path}.corrupt")
        try:
            os.rename(path, aside)
            where = f"moved aside to {os.path.basename(aside)}"
        except OSError as exc:
            where = f"could not move it aside ({exc})"
        log.warning("Skipping corrupt checkpoint %s (%s); %s", path, damage, where)
    return None


def save_checkpoint(directory: str, state: dict, version: int, env_steps: int, keep: int) -> str | None:
    """Write `state` as the newest checkpoint and keep the newest `keep`. None, and nothing written, if a
    float tensor of `state["model"]` holds NaN or inf: resuming from it could never recover."""
    import torch

    bad = nonfinite_tensor(state["model"])
    if bad is not None:
        log.error("%s: policy checkpoint not written: non-finite values in %s; keeping the previous checkpoints",
                  directory, bad)
        return None
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"checkpoint_{version:09d}_{env_steps}.pth")
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    for old in list_checkpoints(directory)[:-keep]:
        os.remove(old)
    return path


def nonfinite_tensor(model_state: dict) -> str | None:
    """The name of a float tensor holding NaN or inf, or None."""
    import torch

    for name, tensor in model_state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def save_best(directory: str, state: dict, record: dict) -> str | None:
    """Write `state` (weights, version, env steps) as `best.pth` and `record` (what made it the best) as
    `best.json`, each to a temporary name first: a reader sees the previous pair or the new one. None, and
    nothing written, for non-finite weights."""
    import torch

    if nonfinite_tensor(state["model"]) is not None:
        return None
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, BEST_NAME)
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    atomic_write_text(os.path.join(directory, "best.json"), json.dumps(record, indent=2))
    return path


def read_best(directory: str) -> dict | None:
    """The `best.json` record of a policy's best checkpoint, or None (none yet, or unreadable)."""
    try:
        with open(os.path.join(directory, "best.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_checkpoint(path: str, device: Any) -> dict:
    """A checkpoint's (or a PBT transfer file's) state, its tensors on `device` (a torch device or its name)."""
    import torch

    return torch.load(path, map_location=device, weights_only=False)
