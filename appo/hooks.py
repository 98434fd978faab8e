"""User hooks: your functions, called in the main process when an episode ends, a learner finishes an
iteration, a checkpoint is written, or an evaluation is done.

Register them from a launcher script before calling `appo.train.main()`:

    from appo import hooks

    @hooks.on_episode_end
    def log_long_episodes(event: hooks.EpisodeEnd) -> None:
        if event.length > 400:
            print("long episode", event.policy, event.reward)

or pass them to `train(..., hooks=Hooks(on_checkpoint=[upload]))`. Hooks run in the runner (the process
that called `train()`, so they may touch your notebook's objects), from the reports the workers send: an
episode's hook runs within about a second of its end, not inside the actor. Keep them quick: the runner
also watches the workers. A hook that raises stops the run, which then fails with the hook's name and
the exception (the traceback is logged).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EpisodeEnd:
    policy: int
    reward: float  # the episode's return (a multi-agent env: this agent's)
    length: int
    objective: float | None  # what PBT ranks by (--pbt_target_objective), when the episode reports it
    extra: dict[str, float]  # the env's info["episode_extra_stats"]
    env_steps: int  # the policy's env steps when the runner heard of it


@dataclass(frozen=True)
class LearnerIteration:
    policy: int
    version: int  # of the weights the iteration produced
    env_steps: int
    stats: dict[str, float]  # the iteration's mean losses, entropy, KL, ...


@dataclass(frozen=True)
class CheckpointSaved:
    policy: int
    path: str
    version: int
    env_steps: int
    best: dict[str, Any] | None = None  # for checkpoint_p<policy>/best.pth: metric, value and the evaluation


@dataclass(frozen=True)
class Evaluation:
    policy: int
    version: int
    env_steps: int
    results: dict[str, float]  # reward, reward_std, length, episodes and the env's episode metrics (means)


@dataclass
class Hooks:
    on_episode_end: list[Callable[[EpisodeEnd], Any]] = field(default_factory=list)
    on_learner_iteration: list[Callable[[LearnerIteration], Any]] = field(default_factory=list)
    on_checkpoint: list[Callable[[CheckpointSaved], Any]] = field(default_factory=list)
    on_evaluation: list[Callable[[Evaluation], Any]] = field(default_factory=list)

    def __add__(self, other: Hooks) -> Hooks:
        return Hooks(*(getattr(self, name) + getattr(other, name) for name in HOOK_NAMES))


HOOK_NAMES = ("on_episode_end", "on_learner_iteration", "on_checkpoint", "on_evaluation")
# What a launcher registered with the decorators below; every run of this process calls them.
registered = Hooks()


def on_episode_end(hook: Callable[[EpisodeEnd], Any]) -> Callable[[EpisodeEnd], Any]:
    registered.on_episode_end.append(hook)
    return hook


def on_learner_iteration(hook: Callable[[LearnerIteration], Any]) -> Callable[[LearnerIteration], Any]:
    registered.on_learner_iteration.append(hook)
    return hook


def on_checkpoint(hook: Callable[[CheckpointSaved], Any]) -> Callable[[CheckpointSaved], Any]:
    registered.on_checkpoint.append(hook)
    return hook


def on_evaluation(hook: Callable[[Evaluation], Any]) -> Callable[[Evaluation], Any]:
    registered.on_evaluation.append(hook)
    return hook
