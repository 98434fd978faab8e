"""What a single-agent env must return for the workers to step it: gymnasium's API, checked once at launch on one reset
and one random step, so that an env written for the old gym API, or one whose observations do not match its space,
is one line naming the env and the call, not a worker's crash after start-up (or a hundred of them, each rebuilt).

Only the form is checked, and only as strictly as the workers read it: an observation of its space's size in a shape
numpy assigns to the space's (a leading axis of 1, say [1, 4] for (4,)) and a one-element terminated flag train as they
always did. A reset or step that raises here is said in one line too ("its reset raised RuntimeError: ..."); the
check is run within a time limit (appo.envs.registry.within), and an env slower than that is left to the workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

OLD_GYM = "an env of the old gym API can be wrapped with shimmy's GymV26CompatibilityV0 (pip install shimmy)"


def api_problem(env: gym.Env, action: Any) -> str | None:
    """What in the env's reset and step (with `action`) departs from gymnasium's API, in a few words; None when
    nothing does."""
    try:
        returned = env.reset(seed=0)
    except Exception as exc:
        return f"its reset raised {raised(exc)}"
    if not (isinstance(returned, tuple) and len(returned) == 2):
        return f"its reset returned {describe(returned)}, not gymnasium's (observation, info); {OLD_GYM}"
    problem = _observation_problem(env.observation_space, returned[0], "reset") or _info_problem(returned[1], "reset")
    if problem:
        return problem
    try:
        returned = env.step(action)
    except Exception as exc:
        return f"its step raised {raised(exc)}"
    if not (isinstance(returned, tuple) and len(returned) == 5):
        return (f"its step returned {describe(returned)}, not gymnasium's 5 (observation, reward, terminated, "
                f"truncated, info); {OLD_GYM}")
    observation, reward, terminated, truncated, info = returned
    if np.ndim(reward) != 0 or np.asarray(reward).dtype.kind not in "biuf":
        return f"its step returned a reward of {describe(reward)}, not a number"
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if np.size(flag) != 1:
            return f"its step returned {name} as {describe(flag)}, not one bool"
    return _observation_problem(env.observation_space, observation, "step") or _info_problem(info, "step")


def _observation_problem(space: gym.Space, observation: Any, call: str) -> str | None:
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(observation, Mapping) or set(observation) != set(space.spaces):
            keys = sorted(observation) if isinstance(observation, Mapping) else describe(observation)
            return f"its {call} returned an observation of keys {keys}, where its observation_space has " \
                   f"{sorted(space.spaces)}"
        return next(filter(None, (_observation_problem(part, observation[key], call)
                                  for key, part in space.spaces.items())), None)
    if isinstance(space, gym.spaces.Box) and not _stores_as(observation, space.shape):
        return (f"its {call} returned an observation of shape {np.shape(observation)}, where its observation_space "
                f"says {space.shape}")
    return None


def _stores_as(observation: Any, shape: tuple[int, ...]) -> bool:
    """Whether the workers' write into a slot of `shape` (numpy assignment) takes `observation` element for element:
    the same size (a scalar would broadcast over the slot), in a shape that assigns."""
    if np.size(observation) != int(np.prod(shape)):
        return False
    try:
        np.empty(shape)[...] = observation
    except (ValueError, TypeError):
        return False
    return True


def _info_problem(info: Any, call: str) -> str | None:
    return None if isinstance(info, Mapping) else f"its {call} returned info as {describe(info)}, not a dict"


def describe(value: Any) -> str:
    """A value an env's call returned, in a few words, for a message that says why it is not what was expected."""
    if value is None:
        return "None"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    return f"a {type(value).__name__}"


def raised(exc: BaseException) -> str:
    """What an env raised, in one line: the exception's type and the first line of its message (the rest is often a
    traceback or a dump the env embeds; appo.tracking.writer.one_line keeps all of a server's short answer instead)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
