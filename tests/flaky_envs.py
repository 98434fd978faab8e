"""Envs that misbehave on purpose, registered on import (used as --env=tests.flaky_envs:Name-v0)."""

import time

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


class HangingCartPole(CartPoleEnv):
    """CartPole whose step blocks (as a deadlocked simulator would) after 200 steps."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > 200:
            time.sleep(3600)
        return super().step(action)


gym.register("HangingCartPole-v0", entry_point=HangingCartPole, max_episode_steps=500)
