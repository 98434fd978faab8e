"""A user's own env in its own file, as a user would write it (used by tests/test_envs.py).

Corridor: start at cell 0 of 8, actions 0 = left, 1 = right; reaching cell 7 pays 1 and ends the
episode; every step costs 0.02; episodes are cut at 40 steps. Random play mostly times out (about
-0.5 per episode); walking right scores 0.86.
"""

import gymnasium as gym
import numpy as np

from appo.envs import register_env


class Corridor(gym.Env):
    def __init__(self, length: int = 8, max_steps: int = 40):
        self.length, self.max_steps = length, max_steps
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self):
        obs = np.zeros(self.length, np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.pos = int(np.clip(self.pos + (1 if action == 1 else -1), 0, self.length - 1))
        self.t += 1
        reached = self.pos == self.length - 1
        return self._obs(), (1.0 if reached else 0.0) - 0.02, reached, self.t >= self.max_steps, {}


def make_corridor(**kwargs) -> Corridor:
    return Corridor(**kwargs)


register_env("my_corridor", make_corridor)
