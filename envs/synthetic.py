"""Synthetic benchmark envs: a step costs a fixed sleep, or a fixed amount of CPU work.

They measure the trainer's plumbing, not learning: observations are random (vector, or uint8 images
when `obs_shape` has three dimensions), rewards are 0 or 1 at random, episodes have a fixed length.

    --env=sleep_env --env_kwargs='{"step_seconds": 0.001, "obs_shape": [64]}'
    --env=cpu_env   --env_kwargs='{"work_iterations": 2000, "obs_shape": [84, 84, 4]}'
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import gymnasium as gym
import numpy as np


class SyntheticEnv(gym.Env):
    def __init__(self, obs_shape: Sequence[int] = (16,), num_actions: int = 4, episode_len: int = 500,
                 step_seconds: float = 0.0, work_iterations: int = 0, render_mode: str | None = None):
        if len(obs_shape) == 3:
            self.observation_space = gym.spaces.Box(0, 255, tuple(obs_shape), np.uint8)
        else:
            self.observation_space = gym.spaces.Box(-1.0, 1.0, tuple(obs_shape), np.float32)
        self.action_space = gym.spaces.Discrete(num_actions)
        self.episode_len, self.step_seconds, self.work_iterations = episode_len, step_seconds, work_iterations
        self.rng = np.random.default_rng()
        self.t = 0
        # Observations are drawn once: producing them must not cost more than the configured step.
        self.frames = [self.observation_space.sample() for _ in range(8)]

    def reset(self, *, seed: int | None = None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        return self.frames[0], {}

    def step(self, action):
        if self.step_seconds > 0:
            time.sleep(self.step_seconds)
        if self.work_iterations > 0:
            self._burn_cpu()
        self.t += 1
        obs = self.frames[self.t % len(self.frames)]
        return obs, float(self.rng.random() < 0.5), False, self.t >= self.episode_len, {}

    def _burn_cpu(self) -> None:
        x = 0
        for i in range(self.work_iterations):
            x += i * i
        self._sink = x


def make_sleep_env(step_seconds: float = 0.001, obs_shape: Sequence[int] = (16,), **kwargs) -> SyntheticEnv:
    return SyntheticEnv(obs_shape=obs_shape, step_seconds=step_seconds, **kwargs)


def make_cpu_env(work_iterations: int = 1000, obs_shape: Sequence[int] = (16,), **kwargs) -> SyntheticEnv:
    return SyntheticEnv(obs_shape=obs_shape, work_iterations=work_iterations, **kwargs)
