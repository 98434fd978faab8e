"""The image encoder in float32 against bfloat16 autocast on this CPU, one thread (what --learner_bf16 and
--inference_bf16 buy; docs/PERFORMANCE.md, "bfloat16 for the CNN").

    python scripts/bench_bf16.py                      # Breakout-sized observations (4x84x84), Nature CNN
    python scripts/bench_bf16.py --rounds 3 --batches 16,32

For each precision, alternating over --rounds: an inference forward pass (the whole model, as an inference
worker runs it) at each of --batches, and one SGD step of the learner on --sgd_batch samples.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from appo.config.cfg import make_config  # noqa: E402
from appo.learning.model import ActorCritic  # noqa: E402


def seconds_per_call(fn, batch, calls: int) -> float:
    for _ in range(2):
        fn(batch)
    started = time.perf_counter()
    for _ in range(calls):
        fn(batch)
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", default="16,32", help="Comma-separated inference batch sizes.")
    parser.add_argument("--sgd_batch", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = make_config(env="unused")
    model = ActorCritic(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4), cfg)
    optimizer = torch.optim.Adam(model.parameters(), 1e-4)

    def observations(n: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
        frames = torch.randint(0, 256, (n, 1, 4, 84, 84), dtype=torch.uint8)
        return {"obs": frames}, torch.zeros(n, 0), torch.zeros(n, 1)

    def forward(batch):
        with torch.inference_mode():
            model.forward_sequence(*batch)

    def sgd_step(batch):
        params, values = model.forward_sequence(*batch)
        loss = params.pow(2).mean() + values.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    sizes = [int(n) for n in args.batches.split(",")]
    for round_ in range(args.rounds):
        for bf16 in (False, True):
            model.set_bf16_images(bf16)
            name = "bfloat16" if bf16 else "float32"
            for n in sizes:
                dt = seconds_per_call(forward, observations(n), 20)
                print(f"round {round_ + 1} {name:8s} forward pass of {n:3d}: {dt * 1e3:6.2f} ms, "
                      f"{dt * 1e6 / n:4.0f} us per observation", flush=True)
            dt = seconds_per_call(sgd_step, observations(args.sgd_batch), 6)
            print(f"round {round_ + 1} {name:8s} SGD step of {args.sgd_batch}: {dt * 1e3:6.1f} ms, "
                  f"{args.sgd_batch / dt:5.0f} samples/s", flush=True)


if __name__ == "__main__":
    main()
