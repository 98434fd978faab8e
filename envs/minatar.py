"""MinAtar's five games (Young and Tian, 2019: Atari's mechanics on a 10x10 grid, one binary channel per kind of
object), as `--env=minatar_<game>`: minatar_asterix, minatar_breakout, minatar_freeway, minatar_seaquest,
minatar_space_invaders. Images small enough for a CPU to train on in minutes, so they stand for image tasks in the
held-out benchmark set (docs/benchmarking.md). Needs the minatar extra (`pip install -e ".[minatar]"`).

MinAtar's observation is a boolean array of 10 x 10 x channels; here it is uint8 with 255 where an object is, so the
encoders treat it as any other image (scaled to [0, 1]). The minimal action set is used: the actions a game reacts to.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


class UInt8Channels(gym.ObservationWrapper):
    """MinAtar's boolean channels as uint8 images (0 or 255)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, env.observation_space.shape, dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation.astype(np.uint8) * np.uint8(255)


def make_minatar(game: str, **kwargs) -> gym.Env:
    from appo.envs.registry import EnvError

    try:
        from minatar.gym import BaseEnv
    except ModuleNotFoundError as exc:
        raise EnvError(f'--env=minatar_{game}: MinAtar is not installed; pip install -e ".[minatar]"') from exc
    return UInt8Channels(BaseEnv(game, use_minimal_action_set=True, **kwargs))


MAKERS = {f"minatar_{game}": functools.partial(make_minatar, game) for game in GAMES}
