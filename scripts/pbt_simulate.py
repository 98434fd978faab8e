"""How often PBT's decisions lift a population out of a learning rate 100x too low, in a crude model.

No trainer runs: the real `appo.population.pbt.decide` and `apply` act on four simulated policies whose progress per
env step is proportional to their learning rate (CartPole at 1e-3 solves in about 250k steps; above 3e-3
progress turns into damage) and whose objective is the CartPole-like reward of that progress with 2.5%
noise. A replacement copies the donor's progress, as taking over its weights would. The model is only a
guide to the --pbt_* flags' scale; scripts/pbt_experiment.py measures the real thing.

    python scripts/pbt_simulate.py --seeds 60
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from appo.population import pbt  # noqa: E402

HYPERPARAMS = {"learning_rate": 1e-5, "exploration_loss_coeff": 0.003, "value_loss_coeff": 0.5,
               "ppo_clip_ratio": 0.1, "ppo_clip_value": 1.0, "max_grad_norm": 4.0, "gae_lambda": 0.95}
SETTINGS = {  # name: (period, mutation rate, perturb min, perturb max)
    "Sample Factory defaults, 25k period": (25_000, 0.15, 1.1, 1.5),
    "rate 0.3, factors 1.2-2, 50k period": (50_000, 0.3, 1.2, 2.0),
    "rate 0.5, factors 1.5-4, 50k period": (50_000, 0.5, 1.5, 4.0),
    "this project's defaults": (25_000, 0.5, 1.5, 4.0),
}


def time_to_solve(seed: int, settings: pbt.Settings, policies: int = 4, steps_per_s: float = 6000.0,
                  seconds: float = 180.0, dt: float = 0.5) -> float | None:
    rng = random.Random(seed)
    progress = [0.0] * policies
    env_steps = [0] * policies
    members = [pbt.Member(dict(HYPERPARAMS)) for _ in range(policies)]
    t = 0.0
    while t < seconds:
        t += dt
        for p in range(policies):
            lr = members[p].hyperparams["learning_rate"]
            rate = lr / 1e-3 if lr <= 3e-3 else 3.0 - (lr - 3e-3) / 1e-3
            progress[p] = min(1.0, max(0.0, progress[p] + rate * steps_per_s * dt / 250_000))
            env_steps[p] += int(steps_per_s * dt)
        rewards = [22 + 478 * x ** 2 for x in progress]
        if max(rewards) >= 475:
            return t
        objectives = [r * (1 + 0.025 * rng.gauss(0, 1)) for r in rewards]
        for event in pbt.decide(env_steps, objectives, members, settings, rng):
            pbt.apply(members, event)
            if event.kind == "replace":
                progress[event.policy] = progress[event.donor]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=60)
    args = parser.parse_args()
    for name, (period, rate, low, high) in SETTINGS.items():
        settings = pbt.Settings(period, period, 0.3, rate, 0.1, 1e-6, low, high)
        times = [time_to_solve(seed, settings) for seed in range(args.seeds)]
        solved = [t for t in times if t is not None]
        median = statistics.median([t if t is not None else float("inf") for t in times])
        print(f"{name:40s} solved within 180 s: {len(solved)}/{args.seeds}, median {median:.0f} s")


if __name__ == "__main__":
    main()
