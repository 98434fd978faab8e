"""Where torch runs: the one place that turns --device into a torch device (inference, learner, evaluator)."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when torch sees a GPU, else the CPU; anything else is passed to torch as it is."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
