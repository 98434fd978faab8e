"""The hyper-parameters population-based training may change during a run, as one frozen record.

A learner reads these values from its policy's `Hyperparams` and nowhere else; the run's flags (the cfg) are never
changed. The record starts as the flags' values (`from_cfg`), and each PBT `SetHyperparams` message replaces it with
an updated copy (`updated`). The fields are the keys of `MUTABLE`, below, which holds PBT's bounds for them
(tests/test_pbt.py checks that the two agree; --help of --with_pbt lists them). Torch-free: the runner's PBT code
(appo/population/pbt.py) reads it.
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


@dataclass(frozen=True)
class Bounds:
    """Where PBT may take one hyper-parameter.

    `low` and `high` are hard bounds: every value is clamped to them. `prior` is the range a resampled value is
    drawn from (`draw_from_prior` in appo/population/pbt.py), None to only perturb. `discount_like` values (gamma,
    GAE lambda) move and are drawn on 1 - x, so they approach 1 by ever smaller steps. A value at 0 (or 1 - x at 0)
    cannot move by a factor, so it first moves to `from_zero`."""

    low: float
    high: float
    from_zero: float
    discount_like: bool = False
    prior: tuple[float, float] | None = None


# The hyper-parameters PBT mutates (the fields of Hyperparams, in the same order), their hard bounds and priors
# (listed in --help of --with_pbt).
#
# Priors: around the values common PPO settings use (the PPO paper's lr 3e-4, clip 0.2, lambda 0.95, gamma 0.99; the
# defaults of CleanRL, Stable-Baselines3 and Sample Factory), so a value drawn from one is a sane start on most tasks,
# tuned to none: learning rate 1e-4 to 3e-3 (log scale, 3e-4 and 1e-3 inside); value loss weight 0.1 to 2; clip ratio
# 0.05 to 0.3 (0.1 and 0.2 are the usual values); value clip 0.1 to 10 (in units of the return, whose scale varies by
# task); grad norm 0.5 to 10; GAE lambda 0.9 to 0.99 and gamma 0.98 to 0.999 (log-uniform on 1 - x: lambda is as likely
# in 0.9-0.97 as in 0.97-0.99); exploration loss 1e-4 to 3e-2 (0.01 is common for discrete actions; more drowns the
# policy gradient).
#
# Hard bounds are wider than the priors, so perturbing can still tune beyond them, except where a value past
# them was seen to stop learning (issue 26): GAE lambda below 0.8 (advantages then see only a few steps ahead;
# 0.5 held a population back while its learning rate recovered) and clip ratios below 0.02 (updates too small
# to move the policy) or above 0.5 (the trust region is gone).
MUTABLE: dict[str, Bounds] = {
    "learning_rate": Bounds(1e-7, 1e-1, from_zero=1e-6, prior=(1e-4, 3e-3)),
    "exploration_loss_coeff": Bounds(0.0, 1.0, from_zero=1e-4, prior=(1e-4, 3e-2)),  # 0 is left alone
    "value_loss_coeff": Bounds(1e-3, 10.0, from_zero=1e-2, prior=(0.1, 2.0)),
    "ppo_clip_ratio": Bounds(0.02, 0.5, from_zero=0.02, prior=(0.05, 0.3)),
    "ppo_clip_value": Bounds(0.01, 100.0, from_zero=0.01, prior=(0.1, 10.0)),
    "max_grad_norm": Bounds(0.01, 100.0, from_zero=0.5, prior=(0.5, 10.0)),  # 0 (no clipping) is left alone
    "gae_lambda": Bounds(0.8, 1.0, from_zero=1e-3, discount_like=True, prior=(0.9, 0.99)),
    "gamma": Bounds(0.8, 1.0, from_zero=1e-3, discount_like=True, prior=(0.98, 0.999)),
}
