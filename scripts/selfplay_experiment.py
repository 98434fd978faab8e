"""Self-play on the built-in duel (envs/duel.py): with an opponent pool against the latest self only, N runs each,
every trained policy scored in games against the duel's scripted opponent, and the untrained policy too.

    python scripts/selfplay_experiment.py --runs 3 --seconds 180 [-- extra trainer flags for both modes]

Each run trains `python -m appo.train --env=duel --seed=<run>` for --seconds, with the pool flags (`pool`) or
without them (`latest`: one policy playing both seats), then plays --games games against the scripted opponent
(`appo.envs.duel.evaluate`: the policy takes the left seat in even games, the right in odd ones; its most likely
action). Two more modes compare PBT's Elo objective: `population` (4 policies playing each other, no PBT) and
`pbt_elo` (the same with --with_pbt=True --pbt_target_objective=elo); every policy is scored, and the table gives
the best one's win rate (the JSON has each policy's and the mean). The untrained policy is a freshly initialised
model of the same architecture (seed = run). Prints a table and the medians, and writes them as JSON (--out).

    python scripts/selfplay_experiment.py --runs 3 --seconds 180 --modes population,pbt_elo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from appo.config.cfg import parse_config
from appo.envs import env_info
from appo.envs.duel import evaluate
from appo.learning.model import ActorCritic
from appo.learning.trained_policy import TrainedPolicy, load_policy, run_cfg
from appo.tools.trainer_process import run_trainer

POOL_FLAGS = ["--self_play_opponents=8", "--self_play_snapshot_every=50", "--self_play_latest_fraction=0.5"]
POLICIES = 4  # of the population modes
# `population`: 4 policies playing each other, no PBT; `pbt_elo`: the same with PBT ranking them by Elo.
POPULATION_FLAGS = [f"--num_policies={POLICIES}", "--with_pbt=False"]
PBT_ELO_FLAGS = [f"--num_policies={POLICIES}", "--with_pbt=True", "--pbt_target_objective=elo"]


def untrained_win_rate(seed: int, games: int) -> float:
    cfg = parse_config(["--env=duel"], num_agents=2)
    info = env_info("duel")
    torch.manual_seed(seed)
    model = ActorCritic(info.obs_space, info.action_space, cfg)
    policy = TrainedPolicy(model, cfg, info.obs_space, info.action_space, 2, torch.device("cpu"))
    return evaluate(lambda obs: policy.act(obs, deterministic=True), games=games, seed=10_000 + seed)["win_rate"]


def train_and_score(name: str, flags: list[str], seed: int, seconds: float, games: int, train_dir: str) -> dict:
    args = ["--env=duel", f"--experiment={name}", f"--train_dir={train_dir}", f"--seed={seed}",
            f"--train_for_seconds={seconds}", "--restart=True", *flags]
    print("python -m appo.train " + " ".join(args), flush=True)
    started = time.monotonic()
    run = run_trainer(args)
    if run.returncode != 0:
        raise SystemExit(f"{name} failed (exit {run.returncode}):\n{run.output[-3000:]}")
    policies, scores = [], []
    exp_dir = os.path.join(train_dir, name)
    for policy_id in range(run_cfg(exp_dir).num_policies):
        policies.append(load_policy(exp_dir, policy_id))
        scores.append(evaluate(lambda obs, p=policies[-1]: p.act(obs, deterministic=True), games=games,
                               seed=10_000 + seed))
    best = max(range(len(scores)), key=lambda p: scores[p]["win_rate"])
    ratings = [line for line in run.output.splitlines() if "ratings:" in line]
    return {"win_rate": scores[best]["win_rate"], "draws": scores[best]["draws"],
            "mean_win_rate": statistics.mean(score["win_rate"] for score in scores),
            "win_rates": [score["win_rate"] for score in scores], "env_steps": sum(p.env_steps for p in policies),
            "version": policies[best].version, "seconds": round(time.monotonic() - started, 1),
            "last_ratings": ratings[-1].split("ratings: ", 1)[-1] if ratings else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=180.0, help="Training time of each run.")
    parser.add_argument("--games", type=int, default=200, help="Games against the scripted opponent per policy.")
    parser.add_argument("--modes", default="pool,latest",
                        help="Which of pool, latest, population, pbt_elo to run, in this order.")
    parser.add_argument("--train_dir", default="train_dir/selfplay")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    args, extra = parser.parse_known_args()
    extra = [flag for flag in extra if flag != "--"]
    modes = {"pool": POOL_FLAGS, "latest": [], "population": POPULATION_FLAGS, "pbt_elo": PBT_ELO_FLAGS}
    results: dict[str, list[dict]] = {mode: [] for mode in args.modes.split(",")}
    results["untrained"] = []
    for run in range(args.runs):
        results["untrained"].append({"win_rate": untrained_win_rate(run, args.games)})
        for mode in results:
            if mode == "untrained":
                continue
            results[mode].append(train_and_score(f"duel_{mode}_{run}", modes[mode] + extra, run, args.seconds,
                                                 args.games, args.train_dir))
            print(f"run {run} {mode}: {results[mode][-1]}", flush=True)
    print(f"\nwin rate against the scripted opponent, {args.games} games per policy, {args.seconds:g} s of training:")
    for mode, runs in results.items():
        rates = [r["win_rate"] for r in runs]
        each = " / ".join(f"{rate:.1%}" for rate in rates)
        means = [r["mean_win_rate"] for r in runs if "mean_win_rate" in r]
        mean = f", mean over the policies {statistics.median(means):.1%}" if means else ""
        print(f"  {mode:10s} {each}   median {statistics.median(rates):.1%}{mean}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"seconds": args.seconds, "games": args.games, "pool_flags": POOL_FLAGS, "extra_flags": extra,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
