"""What a sweep optimises, read from each trial's `result.json` (appo/run/result.py `RunResult`).

The reward objectives are maximised, the *_to_target ones (cost until --target_reward or --target_objective is
reached) minimised. A trial that never reaches the target is given twice what it used (env steps or seconds) as its
value: it ranks behind every trial that reached the target for less than that, and a run that ended at its budget
without the target is behind every run that reached it within the same budget. Its `reached` user attr is False.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from appo.run.result import RunResult

NOT_REACHED_FACTOR = 2.0  # a trial without the target: this times what it used


class TrialFailure(Exception):
    """The trial ran to its end but its result has no value for the objective (no episode finished, NaN)."""


@dataclass(frozen=True)
class Objective:
    name: str
    direction: str  # "maximize" or "minimize", as Optuna names them
    cost: str | None  # for the *_to_target ones: what the trial spends, "env_steps" or "seconds"
    help: str

    @property
    def needs_target(self) -> bool:
        return self.cost is not None

    def value(self, result: RunResult) -> tuple[float, bool | None]:
        """The trial's value from its result.json, and whether it reached the target (None for reward objectives)."""
        if self.cost is not None:
            if result.target is not None:
                value, reached = float(getattr(result.target, self.cost)), True
            else:
                value, reached = NOT_REACHED_FACTOR * float(getattr(result, self.cost)), False
        else:
            value, reached = best_policy_reward(result, best=self.name == "best_reward"), None
        if not math.isfinite(value):
            raise TrialFailure(f"the {self.name} is {value}")
        return value, reached

    def intermediate(self, reward: float) -> float:
        """What is reported to the pruner for a mean reward: minus the reward when the study minimises, so that
        for the median pruner a worse trial is always one with a lower reward."""
        return reward if self.direction == "maximize" else -reward


def best_policy_reward(result: RunResult, best: bool) -> float:
    """The mean reward of the run's best policy at the end (over its last --stats_avg episodes) or, with `best`, the
    highest mean of a full --stats_avg window during the run (the mean at the end for a policy that never filled
    one)."""
    if not result.stats:
        raise TrialFailure("no episode finished")
    return max(result.best_reward(policy) if best else result.final_reward(policy) for policy in result.stats)


OBJECTIVES = {objective.name: objective for objective in (
    Objective("final_reward", "maximize", None,
              "the best policy's mean reward over its last --stats_avg episodes at the end"),
    Objective("best_reward", "maximize", None,
              "the best policy's highest mean reward over a full --stats_avg window during the run"),
    Objective("env_steps_to_target", "minimize", "env_steps",
              "env steps until --target_reward (or --target_objective) was reached"),
    Objective("seconds_to_target", "minimize", "seconds",
              "seconds from the trainer's launch until the target was reached"),
)}
