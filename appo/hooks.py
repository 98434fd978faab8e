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

# The events are the records the workers' reports carry (appo/messages.py).
from appo.messages import CheckpointSaved, EpisodeEnd, Evaluation, LearnerIteration

__all__ = ["CheckpointSaved", "EpisodeEnd", "Evaluation", "Hooks", "LearnerIteration", "on_checkpoint",
           "on_episode_end", "on_evaluation", "on_learner_iteration", "registered"]


@dataclass
class Hooks:
    on_episode_end: list[Callable[[EpisodeEnd], Any]] = field(default_factory=list)
    on_learner_iteration: list[Callable[[LearnerIteration], Any]] = field(default_factory=list)
    on_checkpoint: list[Callable[[CheckpointSaved], Any]] = field(default_factory=list)
    on_evaluation: list[Callable[[Evaluation], Any]] = field(default_factory=list)

    def __add__(self, other: Hooks) -> Hooks:
        return Hooks(*(getattr(self, name) + getattr(other, name) for name in HOOK_NAMES))

    def problem(self) -> str | None:
        """What is not a list of callables here, in a few words (`train(hooks=...)` refuses it before the run); None
        when nothing is."""
        for name in HOOK_NAMES:
            hooks = getattr(self, name)
            if not isinstance(hooks, list):
                return f"Hooks({name}=...) must be a list of functions, not a {type(hooks).__name__}"
            for hook in hooks:
                if not callable(hook):
                    return f"Hooks({name}=[...]) holds {hook!r}, which is not callable"
        return None


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
