"""The hyper-parameters population-based training may change during a run, as one frozen record.

A learner reads these values from its policy's `Hyperparams` and nowhere else; the run's flags (the cfg) are never
changed. The record starts as the flags' values (`from_cfg`), and each PBT `SetHyperparams` message replaces it with
an updated copy (`updated`). The fields are the keys of appo.population.pbt.MUTABLE, which holds PBT's bounds for
them (tests/test_pbt.py checks that the two agree). Torch-free: the runner's PBT code reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hyperparams:
    """One policy's current values of the flags of the same names (see --help)."""

    learning_rate: float
    exploration_loss_coeff: float
    value_loss_coeff: float
    ppo_clip_ratio: float
    ppo_clip_value: float
    max_grad_norm: float  # 0: no gradient clipping
    gae_lambda: float
    gamma: float

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(Hyperparams))

    @staticmethod
    def from_cfg(cfg: Any) -> Hyperparams:
        """The flags' values (a run without PBT keeps them throughout)."""
        return Hyperparams(**{name: getattr(cfg, name) for name in Hyperparams.names()})

    def updated(self, values: Mapping[str, float]) -> Hyperparams:
        """A copy with `values` (some or all of the fields) in place of the current ones."""
        unknown = sorted(set(values) - set(self.names()))
        if unknown:
            raise ValueError(f"not a hyper-parameter PBT may change: {', '.join(unknown)} "
                             f"(those are {', '.join(self.names())})")
        return dataclasses.replace(self, **values)

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)
