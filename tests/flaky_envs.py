"""Envs that misbehave on purpose, registered on import (used as --env=tests.flaky_envs:Name-v0)."""

import builtins
import multiprocessing
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from appo.envs.multi_agent import RendezvousEnv


class FlakyCartPole(CartPoleEnv):
    """CartPole whose step raises every 500th call."""

    calls = 0

    def step(self, action):
        FlakyCartPole.calls += 1
        if FlakyCartPole.calls % 500 == 0:
            raise RuntimeError("flaky env failed on purpose")
        return super().step(action)


class BrokenResetCartPole(CartPoleEnv):
    """CartPole whose reset raises in the workers: not in the main process, where the launch's check of one reset
    would refuse it in one line before any worker starts (the workers' crash report is what it tests)."""

    def reset(self, *, seed=None, options=None):
        if multiprocessing.parent_process() is not None:
            raise RuntimeError("reset is broken on purpose")
        return super().reset(seed=seed, options=options)


class FailingEpisodesCartPole(CartPoleEnv):
    """CartPole whose step raises at the 5th step of a `share` of its episodes (chosen at random at reset)."""

    def __init__(self, share: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.share, self.steps, self.fails = share, 0, False

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.steps, self.fails = 0, self.np_random.random() < self.share
        return obs, info

    def step(self, action):
        self.steps += 1
        if self.fails and self.steps == 5:
            raise RuntimeError("this episode fails on purpose")
        return super().step(action)


gym.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)
gym.register("FailingEpisodesCartPole-v0", entry_point=FailingEpisodesCartPole, max_episode_steps=500)
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


class NaNCartPole(CartPoleEnv):
    """CartPole that returns a NaN observation, or a NaN or infinite reward, once in 1000 steps (per env)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.steps % 1000 == 500:
            obs = obs.copy()
            obs[1] = float("nan")
        elif self.steps % 1000 == 0:
            reward = float("nan") if self.steps % 2000 else float("inf")
        return obs, reward, terminated, truncated, info


gym.register("NaNCartPole-v0", entry_point=NaNCartPole, max_episode_steps=500)


class NonFiniteReturnCartPole(CartPoleEnv):
    """CartPole whose reward at step 3 is NaN in every other episode (the 2nd, 4th, ...) and inf in every fourth;
    `offset` episodes count as played before the first (1: the first is NaN)."""

    def __init__(self, offset: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.episodes, self.steps = offset, 0

    def reset(self, *, seed=None, options=None):
        self.episodes, self.steps = self.episodes + 1, 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.steps == 3 and self.episodes % 2 == 0:
            reward = float("inf") if self.episodes % 4 == 0 else float("nan")
        return obs, reward, terminated, truncated, info


gym.register("NonFiniteReturnCartPole-v0", entry_point=NonFiniteReturnCartPole, max_episode_steps=500)


class FlakyRendezvous(RendezvousEnv):
    """The built-in multi-agent env, whose step raises every 300th call (per env)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def step(self, actions):
        self.calls += 1
        if self.calls % 300 == 0:
            raise RuntimeError("flaky multi-agent env failed on purpose")
        return super().step(actions)


def make_flaky_rendezvous(**kwargs) -> FlakyRendezvous:
    """--env=tests.flaky_envs:make_flaky_rendezvous (a plain function keeps num_agents visible, gym.make would not)."""
    return FlakyRendezvous(**kwargs)


class RandomlyFailingCartPole(CartPoleEnv):
    """CartPole whose step raises once every `min_steps`..`max_steps` steps of this env (drawn anew after each
    failure): scripts/chaos.py --fault=flaky_env."""

    def __init__(self, min_steps: int = 2000, max_steps: int = 20000, **kwargs):
        super().__init__(**kwargs)
        self.min_steps, self.max_steps = min_steps, max_steps
        self.until_failure = int(self.np_random.integers(min_steps, max_steps + 1))

    def step(self, action):
        self.until_failure -= 1
        if self.until_failure <= 0:
            self.until_failure = int(self.np_random.integers(self.min_steps, self.max_steps + 1))
            raise RuntimeError("flaky env failed on purpose")
        return super().step(action)


def make_flaky_cartpole(min_steps: int = 2000, max_steps: int = 20000) -> gym.Env:
    """--env=tests.flaky_envs:make_flaky_cartpole: CartPole-v1 (500-step limit) that fails now and then."""
    return gym.wrappers.TimeLimit(RandomlyFailingCartPole(min_steps, max_steps), max_episode_steps=500)


class OffApiEnv(gym.Env):
    """An env that departs from gymnasium's API in one way (`kind`), from its first reset or step."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, kind: str):
        self.kind, self.steps = kind, 0

    def reset(self, *, seed=None, options=None):
        if self.kind == "raising_reset":
            raise RuntimeError("Expected a numpy array with two dimensions.\nmore lines of the message")
        self.steps = 0
        obs = np.zeros(3, np.float32)
        return obs if self.kind == "old_reset" else (obs, {})

    def step(self, action):
        if self.kind == "raising_step":
            raise KeyError("no such action")
        shapes = {"shape": (4,), "column": (3, 1), "leading_axis": (1, 3)}
        obs = np.zeros(shapes.get(self.kind, (3,)), np.float32)
        reward = np.ones(1) if self.kind == "reward_array" else 1.0
        self.steps += 1
        terminated = self.steps == 10
        if self.kind == "leading_axis":
            terminated = np.array([terminated])  # one element: `if` reads it
        if self.kind == "old_step":
            return obs, reward, terminated, {}
        return obs, reward, terminated, False, [] if self.kind == "info_list" else {}


def make_off_api(kind: str) -> OffApiEnv:
    return OffApiEnv(kind)


def make_raising(error: str) -> gym.Env:
    """A make function that raises the builtin exception named `error`, as an env's constructor can (a bad
    --env_kwargs value, a missing licence)."""
    raise getattr(builtins, error)("the simulator is not licensed\nand more lines")


def make_nothing(**kwargs) -> None:
    """A make function that forgets to return its env."""
