"""Inputs and timing for measuring this run's model in float32 and bfloat16 (scripts/bench_cnn.py).

A CPU that lists avx512_bf16 or amx_bf16 computes bfloat16 natively, but whether the image encoders then run faster
depends on the CPU and on a VM's share of it: on one such Xeon the Nature CNN's forward pass ran 1.7x as fast in
bfloat16 and its SGD step 1.3x, on another listing the same flags 0.6x and 0.7x (docs/PERFORMANCE.md, "The CNN on a
CPU"). The trainer does not time it at start-up: numerics chosen by a timing would make the same command learn
differently on another machine, so --learner_bf16 and --inference_bf16 are off unless given, and
scripts/bench_cnn.py measures them here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from appo.learning.model import ActorCritic
from appo.learning.ppo import forward_trajectories
from appo.memory.buffers import rnn_size


def observations(obs_space: gym.Space, shape: tuple[int, ...], generator: torch.Generator) -> dict[str, Tensor]:
    """Random observations of `obs_space` with leading dims `shape`: uint8 images 0..255, other parts normal."""
    spaces = obs_space.spaces if isinstance(obs_space, gym.spaces.Dict) else {"obs": obs_space}
    return {key: torch.randint(0, 256, (*shape, *s.shape), dtype=torch.uint8, generator=generator)
            if s.dtype == np.uint8 else torch.randn((*shape, *s.shape), generator=generator)
            for key, s in spaces.items()}


def minibatch(model: ActorCritic, obs_space: gym.Space, samples: int, cfg: Any) -> tuple[dict, Tensor, Tensor]:
    """A learner minibatch of whole trajectories (--rollout steps each, like appo.learning.ppo's) with actions drawn
    from the model, and advantages and value targets for it."""
    generator = torch.Generator().manual_seed(1)
    n, length = max(1, samples // cfg.rollout), cfg.rollout
    mb = {"obs": observations(obs_space, (n, length + 1), generator),
          "rnn_states": torch.zeros(n, length + 1, rnn_size(cfg)), "dones": (torch.rand(n, length) < 0.01).float(),
          "rewards": torch.randn(n, length, generator=generator)}
    with torch.no_grad():
        params, values = forward_trajectories(model, cfg.recurrence, mb)
        dist = model.distribution(params)
        mb["actions"] = dist.sample(generator)
        mb["log_probs"], mb["values"] = dist.log_prob(mb["actions"]), values
    mb["bootstrap"] = torch.zeros(n)
    return mb, torch.randn(n, length, generator=generator), values + torch.randn(n, length, generator=generator)


def seconds_per_call(fn: Callable[[], object], min_seconds: float, min_calls: int = 3) -> float:
    calls, started = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds and calls >= min_calls:
            return elapsed / calls
