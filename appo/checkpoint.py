"""Checkpoint files: `checkpoint_p<policy>/checkpoint_<version>_<env_steps>.pth`, written atomically.

A checkpoint is written to a temporary name and renamed into place, so it is either complete or
absent. `verify_checkpoint` checks a file's archive structure and CRCs without importing torch, so
the runner can refuse a corrupt checkpoint before starting anything.
"""

from __future__ import annotations

import glob
import os
import re
import zipfile

from appo.cfg import ConfigError

_NAME = re.compile(r"checkpoint_(\d+)_(\d+)\.pth$")


def checkpoint_dir(exp_dir: str, policy_id: int) -> str:
    return os.path.join(exp_dir, f"checkpoint_p{policy_id}")


def list_checkpoints(directory: str) -> list[str]:
    """Complete checkpoints, oldest first (by policy version)."""
    paths = [p for p in glob.glob(os.path.join(directory, "checkpoint_*.pth")) if _NAME.search(p)]
    return sorted(paths, key=lambda p: int(_NAME.search(p).group(1)))


def latest_checkpoint(directory: str) -> str | None:
    paths = list_checkpoints(directory)
    return paths[-1] if paths else None


def parse_name(path: str) -> tuple[int, int]:
    """(policy version, env steps) encoded in a checkpoint's file name."""
    match = _NAME.search(path)
    if match is None:
        raise ValueError(f"not a checkpoint file name: {path}")
    return int(match.group(1)), int(match.group(2))


def verify_checkpoint(path: str) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{path}: corrupt checkpoint ({exc}); delete it or pass --restart=True") from exc
    if bad is not None:
        raise ConfigError(f"{path}: corrupt checkpoint (bad CRC in {bad}); delete it or pass --restart=True")


def save_checkpoint(directory: str, state: dict, version: int, env_steps: int, keep: int) -> str:
    import torch

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"checkpoint_{version:09d}_{env_steps}.pth")
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in list_checkpoints(directory)[:-keep]:
        os.remove(old)
    return path


def load_checkpoint(path: str, device) -> dict:
    import torch

    return torch.load(path, map_location=device, weights_only=False)
