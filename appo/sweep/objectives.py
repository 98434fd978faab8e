"""What a sweep optimises, read from each trial's `result.json` (appo/run/result.py `RunResult`).

The reward objectives are maximised, the *_to_target ones (cost until --target_reward or --target_objective is
reached) minimised. A reward objective scores only a full --stats_avg window (every env having ended an episode), as
the targets do; a trial without one fails. A trial that never reaches the target is given twice what it used (env
steps or seconds) as its value: it ranks behind every trial that reached the target for less than that, and a run
that ended at its budget without the target is behind every run that reached it within the same budget. Its
`reached` user attr is False.
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
    """The full-window mean reward of the run's best policy at the end (over its last --stats_avg episodes, every env
    having ended one: the rule of the targets) or, with `best`, the highest such mean during the run. A run in which
    no policy filled a window has no score: its few episodes would rank it by luck."""
    if not result.stats:
        raise TrialFailure("no episode finished")
    means = result.best_rewards if best else result.final_rewards
    rewards = [mean for mean in means.values() if mean is not None]
    if not rewards:
        episodes = " and ".join(str(values.get("episodes")) for values in result.stats.values())
        raise TrialFailure(f"no policy filled a full --stats_avg window ({episodes} episodes; every env must have "
                           "ended one too)")
    return max(rewards)


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
