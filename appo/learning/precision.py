"""Whether bfloat16 makes this run's model faster on this CPU: measured, not assumed.

A CPU that lists avx512_bf16 or amx_bf16 computes bfloat16 natively, but whether the image encoders then run faster
depends on the CPU and on a VM's share of it. On one such Xeon the Nature CNN's forward pass ran 1.7x as fast in
bfloat16 and its SGD step 1.3x; on another, listing the same flags, 0.6x and 0.7x, and Breakout sampled 27% fewer env
steps with bfloat16 than without (docs/PERFORMANCE.md, "The CNN on a CPU"). So the auto rule for --inference_bf16
and --learner_bf16 (appo/config/auto.py) times the run's own model both ways at the start of a new experiment, one
thread as the workers run it, in a child process: the runner never imports torch.

    python -m appo.learning.precision < pickle of (cfg, obs_space, action_space, batch)   # prints the ratios as JSON

`observations`, `minibatch` and `seconds_per_call` also serve scripts/bench_cnn.py, which times every option.
"""

from __future__ import annotations

import copy
import json
import pickle
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from appo.config.hyperparams import Hyperparams
from appo.learning.model import ActorCritic
from appo.learning.ppo import forward_trajectories, train_step
from appo.memory.buffers import rnn_size

ROUNDS = 2  # alternating float32 and bfloat16, the faster round of each counts
MIN_SECONDS = 0.1  # timed per precision, part and round; with importing torch the child takes about 5 s


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


def bf16_speedup(cfg: Any, obs_space: gym.Space, action_space: gym.Space, batch: int) -> dict[str, float]:
    """float32's time over bfloat16's (above 1: bfloat16 is faster) for an inference worker's forward pass of `batch`
    observations ("inference") and for the learner's SGD step on two trajectories ("sgd"), on one thread."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hp = Hyperparams.from_cfg(cfg)
    models = {False: ActorCritic(obs_space, action_space, cfg)}
    models[True] = copy.deepcopy(models[False])
    models[True].set_bf16_images(True)
    optimizers = {bf16: torch.optim.Adam(model.parameters(), lr=hp.learning_rate) for bf16, model in models.items()}
    generator = torch.Generator().manual_seed(0)
    obs, states = observations(obs_space, (batch,), generator), torch.zeros(batch, rnn_size(cfg))
    mb, advantages, targets = minibatch(models[False], obs_space, 2 * cfg.rollout, cfg)

    def infer(bf16: bool) -> None:
        with torch.inference_mode():
            models[bf16].forward_step(obs, states)

    def sgd(bf16: bool) -> None:
        train_step(models[bf16], optimizers[bf16], cfg, hp, mb, advantages, targets)

    times: dict[tuple[str, bool], list[float]] = {}
    for bf16 in (False, True):  # first calls apart: Adam's state, the bfloat16 copy, oneDNN's kernels
        infer(bf16)
        sgd(bf16)
    for _ in range(ROUNDS):
        for bf16 in (False, True):
            for part, call in (("inference", infer), ("sgd", sgd)):
                times.setdefault((part, bf16), []).append(seconds_per_call(partial(call, bf16), MIN_SECONDS))
    return {part: min(times[part, False]) / min(times[part, True]) for part in ("inference", "sgd")}


def main() -> None:
    cfg, obs_space, action_space, batch = pickle.load(sys.stdin.buffer)
    print(json.dumps(bf16_speedup(cfg, obs_space, action_space, batch)))


if __name__ == "__main__":
    main()
