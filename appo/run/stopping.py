"""When a run stops: budgets, targets, interruptions, failed workers, stalls. Reads only; writes nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from appo.run.roles import ACTOR, CLUSTER


@dataclass
class TargetReached:
    """The moment a --target_reward or --target_objective was reached, for result.json (appo/run/result.py): the
    sweeps' *_to_target objectives (appo/sweep/) and the time to solve of the benchmark scripts read it."""

    measure: str  # reward or objective
    target: float
    policy: int
    mean: float  # the policy's mean over the last --stats_avg episodes
    env_steps: int  # over all policies
    seconds: float  # since the process started, as the stop line says


@dataclass
class Outcome:
    """Why the run stopped; `completed` runs get the `done` marker."""

    reason: str  # one line, as the stop line says it
    completed: bool
    failed: bool = False
    target: TargetReached | None = None  # set when a target stopped the run


def failed(reason: str) -> Outcome:
    return Outcome(reason, completed=False, failed=True)


def stuck_outcome(cfg, supervisor, last_progress: float, blocked_in: Callable[[], str]) -> Outcome | None:
    """Workers that did not get going in time (actors that cannot build their envs, a cluster with no sampler),
    or a run whose env steps stopped moving (`last_progress`: when they last moved); `blocked_in()` says what every
    worker is doing."""
    late = supervisor.not_ready_after(ACTOR, cfg.reset_timeout_seconds)
    if late:
        return failed(f"{', '.join(late)} did not create and reset its envs within --reset_timeout_seconds="
                      f"{cfg.reset_timeout_seconds:g} of starting; states: {blocked_in()}")
    if supervisor.not_ready_after(CLUSTER, cfg.reset_timeout_seconds):
        return failed(f"the Ray cluster ran no sampler group within --reset_timeout_seconds="
                      f"{cfg.reset_timeout_seconds:g} (is --ray_address={cfg.ray_address!r} right, and does a "
                      f"node have the CPUs a group asks for?); states: {blocked_in()}")
    all_ready_at = supervisor.all_ready_at()  # start-up (torch imports, env creation) is not a stall
    stalled = time.monotonic() - max(last_progress, all_ready_at or 0.0)
    if all_ready_at is not None and stalled > cfg.stall_timeout_seconds:
        return failed(f"no env step for {stalled:.0f} s (--stall_timeout_seconds); worker states: {blocked_in()}")
    return None


def budget_outcome(cfg, reports, elapsed: float) -> Outcome | None:
    """The reward and objective targets, then the benchmark's, env steps' and seconds' budgets: a run that meets
    a target and a budget in the same tick reached its target (a sweep's *_to_target objectives read that)."""
    for measure, target in (("reward", cfg.target_reward), ("objective", cfg.target_objective)):
        solved = None if target is None else reports.solved_policy(target, measure)
        if solved is not None:
            reached = TargetReached(measure, target, solved[0], solved[1], reports.total_env_steps(),
                                    time.time() - psutil.Process().create_time())
            return Outcome(  # one line within 120 columns
                f"target {measure} {target:g} reached by p{reached.policy} (mean {reached.mean:.2f} of "
                f"{cfg.stats_avg}) at {reached.seconds:.1f} s, {reached.env_steps} env steps", completed=True,
                target=reached)
    if cfg.benchmark:  # the budgets count the measured period only, so it is never empty
        _, env_steps, samples = reports.measured()
        if env_steps >= cfg.benchmark_env_steps:
            return Outcome(f"benchmark budget --benchmark_env_steps={cfg.benchmark_env_steps} reached", True)
        if samples >= cfg.benchmark_samples:
            return Outcome(f"benchmark budget --benchmark_samples={cfg.benchmark_samples} reached", True)
    if reports.total_env_steps() >= cfg.train_for_env_steps:
        return Outcome(f"reached --train_for_env_steps={cfg.train_for_env_steps}", completed=True)
    if elapsed >= cfg.train_for_seconds:
        return Outcome(f"reached --train_for_seconds={cfg.train_for_seconds}", completed=True)
    return None
