"""The benchmark suite's tasks: each env with the mean return to reach and a time budget. scripts/suite.py runs
them at the trainer's defaults; scripts/pbt_suite.py runs some of them with longer budgets, PBT against none."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    env: str
    threshold: float | None  # mean return to reach; None: the return at the end of the budget is the result
    budget_s: float
    flags: list[str] = field(default_factory=list)


TASKS = {
    "cartpole": Task("CartPole-v1", 475, 60),
    "lunarlander": Task("LunarLander-v3", 200, 300),
    "pendulum": Task("Pendulum-v1", -200, 120),
    "mountaincar_continuous": Task("MountainCarContinuous-v0", 90, 300),
    "halfcheetah": Task("HalfCheetah-v5", None, 300),
    "bipedalwalker": Task("BipedalWalker-v3", None, 600),
    "breakout": Task("atari_breakout", None, 600),
    "breakout_envpool": Task("envpool:Breakout-v5", None, 600),  # the same preprocessing in C++, batched
    "coop_multi_agent": Task("coop_multi_agent", None, 60),
    "cartpole_masked_rnn": Task("cartpole_masked", 475, 300, ["--use_rnn=True"]),
    "cartpole_masked_ff": Task("cartpole_masked", 475, 150),
}
