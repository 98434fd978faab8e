"""How a finished run ended, as `<exp_dir>/result.json` holds it: the one form in which programs (the sweeps, the
benchmark scripts, the tests) read a run's numbers, so that none of them parses the log's words, which change with
its wording. appo/launch.py writes it through `RunResult.to_dict` when a run stops; `read_result` reads it back."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from appo.run.stopping import TargetReached

RESULT_FILE = "result.json"


@dataclass(frozen=True)
class RunResult:
    """One run's `result.json`. A resumed run's file is its last session's: `env_steps` count the whole run,
    `seconds` that session only."""

    reason: str
    """Why it stopped, in the words of the run's stop line."""
    completed: bool
    """It reached its budget or target (the experiment is marked done); False: interrupted, or failed."""
    failed: bool
    """A worker failed or the run stalled: the reason says which."""
    env_steps: int
    """Env steps over all policies, this run and the runs it resumed."""
    seconds: float
    """This session's wall time, from the start of the run to its stop."""
    stats: dict[int, dict[str, float]]
    """Per policy with a finished episode, at the end: mean `reward` and `length` over its last --stats_avg episodes,
    the number of `episodes` in that mean, the mean `objective` when the env reports one, the env's own means."""
    best_rewards: dict[int, float | None] = field(default_factory=dict)
    """Per policy: the highest mean reward over a full --stats_avg window during the run (None: no full window)."""
    final_rewards: dict[int, float | None] = field(default_factory=dict)
    """Per policy: the mean reward over its last full --stats_avg window at the end, every env having ended an episode,
    the rule of the targets (None: no full window). The sweeps score this."""
    checkpoints: dict[int, str | None] = field(default_factory=dict)
    """Per policy: its newest checkpoint at the end (None: it has none); a path under the experiment dir."""
    faults: dict[str, int] = field(default_factory=dict)
    """This session's faults: env errors, non-finite values set to 0, illegal actions (those an action mask did not
    allow), worker restarts per role."""
    target: TargetReached | None = None
    """When a --target_reward or --target_objective stopped the run: the moment it was reached, with its `seconds`
    counted from the trainer process's start (so start-up is included, as a user launching it waits for it)."""

    def final_reward(self, policy: int = 0) -> float | None:
        """The policy's mean reward over its last --stats_avg episodes at the end (None: no episode finished)."""
        return self.stats.get(policy, {}).get("reward")

    def best_reward(self, policy: int = 0) -> float | None:
        """The policy's best full-window mean reward during the run, else its mean at the end."""
        best = self.best_rewards.get(policy)
        return self.final_reward(policy) if best is None else best

    @property
    def checkpoint(self) -> str | None:
        """Policy 0's newest checkpoint."""
        return self.checkpoints.get(0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (policies as string keys, as JSON objects need)."""
        return {"reason": self.reason, "completed": self.completed, "failed": self.failed,
                "env_steps": self.env_steps, "seconds": self.seconds,
                "stats": {str(p): values for p, values in self.stats.items()},
                "best_rewards": {str(p): best for p, best in self.best_rewards.items()},
                "final_rewards": {str(p): mean for p, mean in self.final_rewards.items()},
                "checkpoints": {str(p): path for p, path in self.checkpoints.items()},
                "faults": dict(self.faults),
                "target": None if self.target is None else asdict(self.target)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """The JSON form back; a field missing from a file written before it existed (final_rewards, checkpoints) is
        empty (faults too). Raises ValueError for a file that is not a result."""
        try:
            target = data.get("target")
            return cls(reason=data["reason"], completed=bool(data["completed"]), failed=bool(data["failed"]),
                       env_steps=int(data["env_steps"]), seconds=float(data["seconds"]),
                       stats={int(p): values for p, values in (data.get("stats") or {}).items()},
                       best_rewards={int(p): best for p, best in (data.get("best_rewards") or {}).items()},
                       final_rewards={int(p): mean for p, mean in (data.get("final_rewards") or {}).items()},
                       checkpoints={int(p): path for p, path in (data.get("checkpoints") or {}).items()},
                       faults={str(name): int(n) for name, n in (data.get("faults") or {}).items()},
                       target=None if target is None else TargetReached(**target))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a run's result: {exc!r}") from exc


def result_path(exp_dir: str) -> str:
    return os.path.join(exp_dir, RESULT_FILE)


def read_result(exp_dir: str) -> RunResult:
    """The result of the run in `exp_dir`. Raises OSError when it wrote none (still running, killed, bad input) and
    ValueError when the file is not a result."""
    with open(result_path(exp_dir)) as f:
        return RunResult.from_dict(json.load(f))
