"""CartPole with the velocities hidden: a task that needs memory.

The observation is [cart position, pole angle] only (gymnasium's CartPole-v1 without the cart velocity and
the pole's angular velocity); dynamics, reward (+1 per step) and the 500-step limit are CartPole-v1's. A
policy must tell from the last few observations which way the pole is falling, so a recurrent policy
(`--use_rnn=True`) can balance it for the whole episode, while a feed-forward one sees only a snapshot and
keeps losing the pole. Registered as "cartpole_masked":

    python -m appo.train --env=cartpole_masked --use_rnn=True
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

VISIBLE = [0, 2]  # cart position and pole angle; 1 and 3 are the velocities


class MaskedVelocity(gym.ObservationWrapper):
    """Keeps only the position entries of CartPole's observation."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[VISIBLE], space.high[VISIBLE], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[VISIBLE]


def make_masked_cartpole(**kwargs: Any) -> gym.Env:
    """CartPole-v1 (with its 500-step limit) seeing positions only."""
    return MaskedVelocity(gym.make("CartPole-v1", disable_env_checker=True, **kwargs))
