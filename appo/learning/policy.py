"""A policy as one object: weights, optimizer state, hyper-parameters, version, counters and self-play pool.

The learner process holds one `Policy` and trains it; population-based training acts on it through two
operations only: `set_hyperparams` (a new learning rate, loss coefficients, ...; applied from the next
training iteration) and `adopt` (take over another policy's weights and optimizer state while keeping
this policy's own hyper-parameters and an ever-increasing version). Self-play acts on it through
`take_snapshot`: a frozen copy of the weights joins its opponent pool (acting ids: appo/config/topology.py), which
is saved with its checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch

from appo.config.flags import KL_ADAPTIVE_RANGE, KL_ADAPTIVE_STEP
from appo.config.hyperparams import Hyperparams
from appo.learning.model import ActorCritic
from appo.learning.weights import frozen_weights


def scheduled_learning_rate(base: float, schedule: str, env_steps: int, budget: int) -> float:
    """The learning rate after `env_steps` of a `budget`: `base` throughout (constant, kl_adaptive), or down from
    `base` to 0 at the budget (linear), so the last updates of a budgeted run are small ones."""
    if schedule != "linear":
        return base
    return base * max(0.0, 1.0 - env_steps / budget)


def kl_adapted_factor(factor: float, kl: float, threshold: float) -> float:
    """The learning rate's multiple of --learning_rate after an iteration whose minibatches moved the policy `kl`
    from the weights it started with on average: smaller when `kl` was over twice the threshold, larger when under
    half of it. The same flags give a task whose policy moves fast a smaller rate than one whose policy barely moves."""
    if kl > 2.0 * threshold:
        factor /= KL_ADAPTIVE_STEP
    elif kl < 0.5 * threshold:
        factor *= KL_ADAPTIVE_STEP
    low, high = KL_ADAPTIVE_RANGE
    return min(max(factor, low), high)


def make_optimizer(model: torch.nn.Module, learning_rate: float, cfg: Any) -> torch.optim.Adam:
    """The learner's Adam, fused: one kernel over all the weights, several times faster on a CPU than the per-weight
    loop torch runs there by default (docs/PERFORMANCE.md, "The learner's optimizer"), and its `found_inf` lets a
    non-finite update be skipped on the device (appo/learning/ppo.py `apply_gradients`)."""
    return torch.optim.Adam(model.parameters(), lr=learning_rate, eps=cfg.adam_eps,
                            betas=(cfg.adam_beta1, cfg.adam_beta2), fused=True)


def load_optimizer_state(optimizer: torch.optim.Adam, state: dict) -> None:
    """Load a saved optimizer state into a `make_optimizer` Adam. A checkpoint written before the optimizer was fused
    says `fused: None` in its groups, which loading would restore, and keeps its step counts on the CPU: both are
    brought to the fused form."""
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = True, None
        for param in group["params"]:
            saved = optimizer.state.get(param, {})
            if "step" in saved:
                saved["step"] = saved["step"].to(param.device, torch.float32)


class Policy:
    """Owns the model, its optimizer and the policy's `Hyperparams` (the only values PBT changes; the run's flags
    are read, never changed)."""

    def __init__(self, policy_id: int, cfg: Any, spaces: tuple[gym.Space, gym.Space], device: torch.device,
                 hyperparams: Hyperparams | None = None):
        """`cfg`: the run's flags (a `Config`, or the learner's view of it); `hyperparams`: the policy's (PBT's, for a
        learner of a PBT run); without them, the flags' (then `cfg` must be the whole `Config`)."""
        self.policy_id, self.device = policy_id, device
        self.lr_schedule, self.budget = cfg.lr_schedule, cfg.train_for_env_steps
        self.kl_threshold = cfg.lr_schedule_kl_threshold
        self.lr_factor = 1.0  # --lr_schedule=kl_adaptive: the rate's multiple of --learning_rate
        self.hyperparams = hyperparams if hyperparams is not None else Hyperparams.from_cfg(cfg)
        self.model = ActorCritic(*spaces, cfg).to(device)
        self.optimizer = make_optimizer(self.model, self.hyperparams.learning_rate, cfg)
        self.version = 0  # of the weights; +1 per training iteration and per adoption
        self.env_steps = 0  # this policy took (counted by the learner, so it survives resume)
        self.train_steps = 0
        # Trajectories with a step sampled by an older version were collected by weights this policy has
        # replaced (`adopt`); the learner drops them.
        self.min_version = 0
        # Self-play opponent pool: --self_play_opponents frozen copies {"version", "weights"} (None: not taken yet).
        self.snapshots: list[dict | None] = [None] * cfg.self_play_opponents
        self.snapshot_every = cfg.self_play_snapshot_every

    def set_hyperparams(self, values: Mapping[str, float]) -> None:
        """New values for some hyper-parameters (ValueError for a name PBT may not change)."""
        self.hyperparams = self.hyperparams.updated(values)
        self.apply_learning_rate()

    def follow_kl(self, kl: float | None) -> None:
        """--lr_schedule=kl_adaptive: move the learning rate's factor by an iteration's mean KL (None: the iteration
        applied no update); the next `apply_learning_rate` sets it."""
        if kl is not None and self.lr_schedule == "kl_adaptive":
            self.lr_factor = kl_adapted_factor(self.lr_factor, kl, self.kl_threshold)

    def apply_learning_rate(self) -> None:
        """Set the optimizer's learning rate: the hyper-parameter's, where --lr_schedule puts it at these env steps,
        times the factor `follow_kl` keeps (1 but with kl_adaptive)."""
        lr = self.lr_factor * scheduled_learning_rate(self.hyperparams.learning_rate, self.lr_schedule,
                                                      self.env_steps, self.budget)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ---------------------------------------------------------------- self-play
    def snapshot_due(self) -> bool:
        """Whether the current version joins the opponent pool (every --self_play_snapshot_every versions)."""
        return bool(self.snapshots) and self.version % self.snapshot_every == 0

    def take_snapshot(self) -> tuple[int, int | None]:
        """Freeze the current weights into the pool in place of the oldest snapshot (or an empty place); returns
        the place and the version it replaced (None if it was empty)."""
        place = min(range(len(self.snapshots)),
                    key=lambda k: -1 if self.snapshots[k] is None else self.snapshots[k]["version"])
        replaced = self.snapshots[place]
        self.snapshots[place] = {"version": self.version, "weights": frozen_weights(self.model)}
        return place, None if replaced is None else replaced["version"]

    def _restore_snapshots(self, saved: list[dict | None]) -> None:
        """The saved pool, its newest --self_play_opponents snapshots if it was bigger."""
        newest = sorted((s for s in saved if s is not None), key=lambda s: s["version"])[-len(self.snapshots):]
        self.snapshots = newest + [None] * (len(self.snapshots) - len(newest)) if self.snapshots else []

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Everything a checkpoint or another policy needs."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "version": self.version, "env_steps": self.env_steps, "train_steps": self.train_steps,
                "min_version": self.min_version, "hyperparams": self.hyperparams.as_dict(),
                "snapshots": self.snapshots, "lr_factor": self.lr_factor}

    def load_state_dict(self, state: dict) -> None:
        """Resume this policy from its own checkpoint. Hyper-parameters are not taken from it: with PBT the
        population file holds them, without PBT the flags do."""
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.version, self.env_steps, self.train_steps = state["version"], state["env_steps"], state["train_steps"]
        self.min_version = state.get("min_version", 0)
        self.lr_factor = state.get("lr_factor", 1.0)
        self._restore_snapshots(state.get("snapshots", []))
        self.apply_learning_rate()  # the optimizer state carried the saved learning rate

    def adopt(self, donor_state: dict) -> None:
        """Take over another policy's weights (normalisation statistics included) and optimizer state.

        The version moves past every version this policy published, so inference picks the new weights up
        and lag accounting stays monotonic; trajectories from before are dropped (`min_version`). Env-step
        and train-step counters and the self-play pool stay this policy's own."""
        self.model.load_state_dict(donor_state["model"])
        load_optimizer_state(self.optimizer, donor_state["optimizer"])
        self.lr_factor = donor_state.get("lr_factor", 1.0)
        self.apply_learning_rate()
        self.version += 1
        self.min_version = self.version

