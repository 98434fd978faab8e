"""Scaling with the number of workers, against plain processes: the synthetic sleep env by default, or any env.

For each worker count: the raw limit (that many plain processes stepping 8 envs each; the sleep env takes 1 ms
per step) and the sampler-only trainer with the same workers, next to ideal linear scaling from one plain
process. Prints a table, saves it as JSON and plots it as PNG.

    python scripts/bench_scaling.py --max_workers=64 --out=docs/scaling
    python scripts/bench_scaling.py --env=doom_basic --max_workers=4 --out=docs/scaling_doom
"""

from __future__ import annotations

import argparse
import json

from appo.tools.raw_limit import env_steps_for, raw_limit, sampler_only_fps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="sleep_env")
    parser.add_argument("--max_workers", type=int, default=64)
    parser.add_argument("--num_envs_per_worker", type=int, default=8)
    parser.add_argument("--step_seconds", type=float, default=0.001, help="The sleep env's step time.")
    parser.add_argument("--seconds", type=float, default=8.0, help="Length of each raw-limit measurement.")
    parser.add_argument("--out", default="scaling", help="Writes OUT.json and OUT.png.")
    parser.add_argument("trainer_args", nargs="*", help="Extra flags for appo.train (after --).")
    args = parser.parse_args()
    env_kwargs = {"step_seconds": args.step_seconds} if args.env == "sleep_env" else {}

    counts = []
    n = 1
    while n <= args.max_workers:
        counts.append(n)
        n *= 2
    rows = []
    print(f"{'workers':>7} {'ideal':>10} {'raw limit':>10} {'trainer':>10} {'trainer/raw':>11}  bottleneck")
    for workers in counts:
        raw = raw_limit(args.env, workers, args.num_envs_per_worker, args.seconds, env_kwargs)
        summary = sampler_only_fps(args.env, workers, args.num_envs_per_worker,
                                   max(2000, env_steps_for(args.env, raw, args.seconds, env_kwargs)),
                                   args.trainer_args, env_kwargs)
        ideal = (rows[0]["raw"] if rows else raw) * workers
        row = {"workers": workers, "ideal": ideal, "raw": raw, "trainer": summary["env_frames_per_s"],
               "ratio": summary["env_frames_per_s"] / raw, "bottleneck": summary["bottleneck"]}
        rows.append(row)
        print(f"{workers:7d} {ideal:10.0f} {raw:10.0f} {row['trainer']:10.0f} {row['ratio']:11.1%}  "
              f"{row['bottleneck']}", flush=True)

    with open(f"{args.out}.json", "w") as f:
        json.dump({"env": args.env, "env_kwargs": env_kwargs, "num_envs_per_worker": args.num_envs_per_worker,
                   "rows": rows}, f, indent=2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'); skipped the plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    workers = [r["workers"] for r in rows]
    for key, label, style in (("ideal", "ideal linear", "k--"), ("raw", "plain processes (raw limit)", "o-"),
                              ("trainer", "sampler-only trainer", "s-")):
        ax.plot(workers, [r[key] for r in rows], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    step = f", {args.step_seconds * 1e3:g} ms per step" if args.env == "sleep_env" else ""
    ax.set_xlabel(f"actor workers ({args.num_envs_per_worker} envs each of {args.env}{step})")
    ax.set_ylabel("env frames / s")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=120)
    print(f"saved {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
