"""Compare PBT rule sets in a crude model: do they rescue bad starts, and do they harm a good one?

No trainer runs: the real `appo.population.pbt` code (initial_members, decide, apply) acts on four simulated
policies, starting from the flags' defaults with one start changed: (a) a learning rate of 1e-5 (100x too low),
(b) a GAE lambda of 0.5 at the default learning rate, (c) the defaults. The model is crude, and only a guide to the
--pbt_* flags' scale (scripts/pbt_experiment.py measures the real thing):

- A policy's progress x (0 to 1) grows per env step at a rate 1 / 250k (CartPole at lr 1e-3 solves in about 250k
  steps) times a factor per hyper-parameter: lr / 1e-3 up to 3e-3, then falling, and negative (damage, x falls)
  past 6e-3; (1 - 0.9) / (1 - lambda) below a GAE lambda of 0.9 (0.5 at 0.8, 0.2 at 0.5); clip / 0.05 below a clip
  ratio of 0.05, (0.4 / clip)^2 above 0.4. The other hyper-parameters have no effect, so an explore that moves
  only them is a wasted period, as a move that does not matter would be.
- The objective is the CartPole-like return 22 + 478 x^2 of the progress, with a standard error of 2.5% of it
  (Gaussian noise of that size at each decision; the new rules are given the error, today's had no use for it).
- Each policy takes 6000 env steps/s; a replacement copies the donor's progress, as taking over its weights would.
  Solved: the best policy's return reaches 475 within 180 s (1.08M env steps per policy).
- Its biases: speed grows linearly with the learning rate up to 3e-3, and moving the other values costs nothing, so
  it favours big and frequent moves from a good start; it cannot show the harm of losing a tuned value to a resample.

Today's rule set: --pbt_mutation_rate=0.5, factors 1.5-4, no resampling, every policy outside the top explores, and
today's hard bounds (GAE lambda down to 0.5, clip ratio 0.01-1). With 4 policies and --pbt_replace_fraction=0.3
the top and bottom are 2 each and there is no middle, so the new decide reproduces "everyone outside the top
explores" exactly; only its "at least one value moves" differs (at rate 0.5 over 7 values, 1 explore in 128).

    python scripts/pbt_simulate.py --seeds 60
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from appo.config.cfg import make_config  # noqa: E402
from appo.population import pbt  # noqa: E402

POLICIES = 4
STEPS_PER_S = 6000.0
SECONDS = 180.0
DT = 0.5
TARGET = 475.0
NOISE = 0.025

STARTS = {"lr 1e-5": {"learning_rate": 1e-5}, "lambda 0.5": {"gae_lambda": 0.5}, "defaults": {}}
# name: the --pbt_* flags it sets (None: PBT off), and whether it runs with today's hard bounds.
RULE_SETS: dict[str, tuple[dict | None, bool]] = {
    "PBT off": (None, False),
    "today: rate 0.5, 1.5-4, no resample": (
        {"pbt_mutation_rate": 0.5, "pbt_perturb_min": 1.5, "pbt_perturb_max": 4.0, "pbt_resample_probability": 0.0},
        True),
    "new defaults": ({}, False),
    "new, resample 0": ({"pbt_resample_probability": 0.0}, False),
    "new, resample 0.25": ({"pbt_resample_probability": 0.25}, False),
    "new, factors 1.5-4": ({"pbt_perturb_min": 1.5, "pbt_perturb_max": 4.0}, False),
    "new, rate 0.3": ({"pbt_mutation_rate": 0.3}, False),
}
TODAY_BOUNDS = {"gae_lambda": pbt.Bounds(0.5, 1.0, from_zero=1e-3, discount_like=True),
                "ppo_clip_ratio": pbt.Bounds(0.01, 1.0, from_zero=0.01)}


def progress_rate(h: dict[str, float]) -> float:
    """Progress per env step, in the model of the docstring."""
    lr = h["learning_rate"]
    rate = lr / 1e-3 if lr <= 3e-3 else 3.0 - (lr - 3e-3) / 1e-3
    if h["gae_lambda"] < 0.9:
        rate *= 0.1 / (1.0 - h["gae_lambda"])
    clip = h["ppo_clip_ratio"]
    if clip < 0.05:
        rate *= clip / 0.05
    elif clip > 0.4:
        rate *= (0.4 / clip) ** 2
    return rate / 250_000


def time_to_solve(seed: int, cfg, settings: pbt.Settings | None) -> float | None:
    """Seconds until the best policy's return reaches TARGET (None: not within SECONDS); no PBT when `settings` is
    None."""
    rng = random.Random(seed)
    members = pbt.initial_members(cfg, POLICIES, {}, {}, rng)
    progress = [0.0] * POLICIES
    env_steps = [0] * POLICIES
    t = 0.0
    while t < SECONDS:
        t += DT
        for p, member in enumerate(members):
            progress[p] = min(1.0, max(0.0, progress[p] + progress_rate(member.hyperparams) * STEPS_PER_S * DT))
            env_steps[p] += int(STEPS_PER_S * DT)
        returns = [22 + 478 * x ** 2 for x in progress]
        if max(returns) >= TARGET:
            return t
        if settings is None:
            continue
        objectives = [r * (1 + NOISE * rng.gauss(0, 1)) for r in returns]
        errors = [NOISE * r for r in returns]
        for event in pbt.decide(env_steps, objectives, members, settings, rng, errors):
            pbt.apply(members, event)
            if event.kind == "replace":
                progress[event.policy] = progress[event.donor]
    return None


@contextmanager
def hard_bounds(today: bool) -> Iterator[None]:
    """Today's hard bounds in place of the new ones while a rule set runs, when `today`."""
    saved = dict(pbt.MUTABLE)
    if today:
        pbt.MUTABLE.update(TODAY_BOUNDS)
    try:
        yield
    finally:
        pbt.MUTABLE.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=60)
    args = parser.parse_args()
    base = make_config(env="CartPole-v1", num_policies=POLICIES, with_pbt=True)
    print(f"{'rule set':38s}" + "".join(f"{start:>22s}" for start in STARTS))
    print(f"{'':38s}" + f"{'solved, median s':>22s}" * len(STARTS))
    for name, (flags, today) in RULE_SETS.items():
        cells = []
        for start in STARTS.values():
            cfg = dataclasses.replace(base, **start, **(flags or {}))
            settings = None if flags is None else pbt.Settings.from_cfg(cfg)
            with hard_bounds(today):
                times = [time_to_solve(seed, cfg, settings) for seed in range(args.seeds)]
            solved = [t for t in times if t is not None]
            median = statistics.median([t if t is not None else float("inf") for t in times])
            cells.append(f"{len(solved)}/{args.seeds}, " + ("-" if median == float("inf") else f"{median:.0f}"))
        print(f"{name:38s}" + "".join(f"{cell:>22s}" for cell in cells))


if __name__ == "__main__":
    main()
