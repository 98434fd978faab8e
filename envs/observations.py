"""Observation spaces the models do not take as they are, turned into ones they do (a Box, or a Dict of Boxes:
appo.spaces.obs_spaces), so that gymnasium's toy-text envs (Taxi, FrozenLake, Blackjack), PettingZoo's games and envs
that observe counts, flags or choices train unchanged:

- A Box stays as it is, and so does each Box of a Dict (an image, a vector, the action mask).
- Discrete, MultiDiscrete and MultiBinary become float32 vectors (gymnasium.spaces.flatten): one-hot per choice, since
  a state's index or a card's number is no magnitude an MLP should read, and the bits as they are.
- A Tuple, and a Dict's key that holds a Tuple or a Dict, becomes one vector of its parts flattened, so that one MLP
  sees them together: the model's heads are linear over the features of the keys, and Blackjack's player sum, dealer
  card and usable ace mean something only together. A Tuple that holds an image keeps its parts apart instead, as a
  Dict keyed "0", "1", ...
- Text, Graph, Sequence and OneOf spaces, of no fixed size or no fixed kind, are a SpaceError naming the space.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from appo.spaces import SpaceError, is_image, obs_spaces

FLATTENED = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Tuple, gym.spaces.Dict)


def _check_flattens(space: gym.Space, whole: gym.Space) -> None:
    if isinstance(space, gym.spaces.Box):
        return
    if not isinstance(space, FLATTENED):
        raise SpaceError(f"unsupported observation space {whole}: its part {space} has no fixed-size vector form; "
                         "use Box, Discrete, MultiDiscrete, MultiBinary, or a Tuple or Dict of them")
    parts = space.spaces.values() if isinstance(space, gym.spaces.Dict) else getattr(space, "spaces", ())
    for part in parts:
        _check_flattens(part, whole)


def _as_dict(space: gym.spaces.Tuple) -> gym.spaces.Dict:
    return gym.spaces.Dict({str(i): part for i, part in enumerate(space.spaces)})


def _keeps_parts(space: gym.Space) -> bool:
    """A Tuple holding an image: seen as a Dict of its parts rather than one vector."""
    return isinstance(space, gym.spaces.Tuple) and any(is_image(part) for part in space.spaces)


def _vector_space(space: gym.Space) -> gym.spaces.Box:
    flat = gym.spaces.flatten_space(space)
    return gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32), dtype=np.float32)


def model_space(space: gym.Space) -> gym.Space:
    """The space the models see for an env's observation `space` (the module docstring); SpaceError when none."""
    _check_flattens(space, space)
    if isinstance(space, gym.spaces.Box):
        return space
    if _keeps_parts(space):
        return model_space(_as_dict(space))
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({key: part if isinstance(part, gym.spaces.Box) else _vector_space(part)
                                for key, part in space.spaces.items()})
    return _vector_space(space)


def model_observation(space: gym.Space, observation: Any) -> Any:
    """`observation` of the env's `space` as the models see it (of `model_space(space)`)."""
    if isinstance(space, gym.spaces.Box):
        return observation
    if _keeps_parts(space):
        return model_observation(_as_dict(space), {str(i): part for i, part in enumerate(observation)})
    if isinstance(space, gym.spaces.Dict):
        return {key: observation[key] if isinstance(part, gym.spaces.Box) else
                gym.spaces.flatten(part, observation[key]).astype(np.float32) for key, part in space.spaces.items()}
    return gym.spaces.flatten(space, observation).astype(np.float32)


def is_model_space(space: gym.Space) -> bool:
    """Whether the models take `space` as it is (appo.spaces.obs_spaces reads it)."""
    try:
        obs_spaces(space)
    except SpaceError:
        return False
    return True


def model_observations(space: gym.Space) -> Callable[[Any], Any]:
    """`model_observation` for `space` as a function built once and called every step: the identity where the
    observations are the models' already (a Box, a Dict of Boxes), so those steps pay nothing."""
    if is_model_space(space):
        return lambda observation: observation
    return lambda observation: model_observation(space, observation)


class ModelObservations(gym.ObservationWrapper):
    """A single-agent env whose observations are given as the models see them (the module docstring)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.given_space = env.observation_space
        self.observation_space = model_space(self.given_space)

    def observation(self, observation: Any) -> Any:
        return model_observation(self.given_space, observation)


def with_model_observations(env: gym.Env) -> gym.Env:
    """The env, wrapped in ModelObservations where its observations are not a Box or a Dict of Boxes already; a
    SpaceError (the env closed) where they have no form the models take."""
    if is_model_space(env.observation_space):
        return env
    try:
        return ModelObservations(env)
    except SpaceError:
        env.close()
        raise
