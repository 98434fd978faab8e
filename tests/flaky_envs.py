"""Envs that misbehave on purpose, registered on import (used as --env=tests.flaky_envs:Name-v0)."""

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class FlakyCartPole(CartPoleEnv):
    """CartPole whose step raises every 500th call."""

    calls = 0

    def step(self, action):
        FlakyCartPole.calls += 1
        if FlakyCartPole.calls % 500 == 0:
            raise RuntimeError("flaky env failed on purpose")
        return super().step(action)


class BrokenResetCartPole(CartPoleEnv):
    def reset(self, *, seed=None, options=None):
        raise RuntimeError("reset is broken on purpose")


gym.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)
gym.register("BrokenResetCartPole-v0", entry_point=BrokenResetCartPole, max_episode_steps=500)
