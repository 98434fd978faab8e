"""PBT against the same population without PBT, N runs each, and a plot of one PBT run.

Presets (the flags each run gets are printed):
- `cartpole`: 4 policies on CartPole-v1, all at a learning rate 100x below the default; solved is a mean
  reward of 475 over the last 100 episodes.
- `mountaincar`: 4 policies on `mountain_car_shaped` (pushing costs fuel; the velocity bonus starts too small
  to pay for it, so a policy learns to coast), against single-policy runs at that bonus (all the machine's
  samples for one policy). Policies are ranked by `progress` (how far toward the goal the car got, 1.0 at
  the goal; never the shaped reward): the goal itself (`true_objective`) is 0 for everyone until someone
  reaches it, which ranks nothing. Solved is a mean progress of 0.99 over the last 100 episodes: at least
  96 of them reached the goal.

    python scripts/pbt_experiment.py cartpole --runs 3 --out train_dir/pbt_cartpole [-- extra trainer flags]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pbt_plot import load_history, plot  # noqa: E402
from time_to_solve import run_trainer  # noqa: E402

# `baseline` flags replace the common ones of the same name in runs without PBT.
PRESETS = {
    "cartpole": {"flags": ["--env=CartPole-v1", "--num_policies=4", "--learning_rate=1e-5"], "baseline": [],
                 "target": "--target_reward=475", "seconds": 180, "shaping": None},
    # Pushing costs fuel, so a policy learns to coast unless the bonus pays for swinging (envs/shaped_mountain_car.py).
    "mountaincar": {"flags": ["--env=mountain_car_shaped", "--num_policies=4", "--normalize_input=True",
                              "--pbt_target_objective=progress"],
                    "baseline": ["--num_policies=1"], "target": "--target_objective=0.99", "seconds": 300,
                    "shaping": "velocity_bonus"},
}
# The trainer's status: a progress line ("41.2% of 1M steps in 3m12s, ETA 4m35s | env steps 412345 | FPS ...")
# and one line per policy ("  p0: v12, reward 123.45 length 123.4 (100 of 2345 episodes), objective 0.123, ...").
PROGRESS = re.compile(r"env steps \d+")
POLICY_STATS = re.compile(r"\bp(\d+): v\d+, reward (-?[0-9.]+) length(?:.*?, objective (-?[0-9.]+))?")


def final_stats(output: str) -> dict[int, dict[str, float]]:
    """Each policy's mean reward (and objective, when shown) in the trainer's last status."""
    lines = output.splitlines()
    progress = [i for i, line in enumerate(lines) if PROGRESS.search(line)]
    if not progress:
        return {}
    stats = {}
    for line in lines[progress[-1] + 1:]:  # the summary after it says "p0: final reward", which does not match
        match = POLICY_STATS.search(line)
        if match:
            p, r, o = match.groups()
            stats[int(p)] = {"reward": float(r), **({"objective": float(o)} if o else {})}
    return stats


def with_overrides(flags: list[str], overrides: list[str]) -> list[str]:
    names = {flag.split("=")[0] for flag in overrides}
    return [flag for flag in flags if flag.split("=")[0] not in names] + overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="baseline,pbt", help="baseline (no PBT) and/or pbt, comma-separated.")
    parser.add_argument("--seconds", type=float, default=None, help="Budget of each run (default: the preset's).")
    parser.add_argument("--out", default="train_dir/pbt_experiment", help="Folder for the runs, summary and plot.")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.trainer_args = argv[split + 1:]  # extra flags for appo.train, after --
    preset = PRESETS[args.preset]
    seconds = args.seconds or preset["seconds"]
    os.makedirs(args.out, exist_ok=True)
    results: dict[str, list[dict]] = {}
    for mode in args.modes.split(","):
        flags = preset["flags"] if mode == "pbt" else with_overrides(preset["flags"], preset["baseline"])
        flags = [*flags, preset["target"], f"--train_for_seconds={seconds}", "--restart=True",
                 f"--with_pbt={mode == 'pbt'}", *args.trainer_args]
        print(f"{mode}: python -m appo.train {' '.join(flags)}", flush=True)
        for index in range(args.runs):
            experiment = f"{args.preset}_{mode}_{index}"
            run = run_trainer([f"--train_dir={args.out}", f"--experiment={experiment}", *flags])
            stats = final_stats(run.output)
            result = {"experiment": experiment, "solved_s": run.solved_s, "env_steps": run.env_steps,
                      "final": stats, "returncode": run.returncode,
                      "replacements": run.output.count(" takes over policy ")}
            results.setdefault(mode, []).append(result)
            best = max(stats.values(), key=lambda s: s.get("objective", s["reward"]), default={})
            outcome = (f"solved in {run.solved_s:.1f} s ({run.env_steps} env steps)" if run.solved_s is not None
                       else f"not solved in {seconds:.0f} s")
            print(f"  run {index}: {outcome}; best policy at the end: {best}; "
                  f"{result['replacements']} replacements", flush=True)
        times = [r["solved_s"] if r["solved_s"] is not None else float("inf") for r in results[mode]]
        print(f"{mode}: median time to solve {statistics.median(times):.1f} s over {args.runs} runs", flush=True)

    with open(os.path.join(args.out, f"{args.preset}_summary.json"), "w") as f:
        json.dump(results, f, indent=2)
    if "pbt" in results:  # plot the run with the median time (unsolved runs count as slowest)
        ranked = sorted(results["pbt"], key=lambda r: r["solved_s"] if r["solved_s"] is not None else float("inf"))
        median_run = ranked[len(ranked) // 2]["experiment"]
        out = os.path.join(args.out, f"{args.preset}_pbt.png")
        plot(load_history(os.path.join(args.out, median_run)), out, f"{args.preset}: {median_run}", preset["shaping"])
        print(f"plot of {median_run}: {out}")


if __name__ == "__main__":
    main()
