"""The public benchmark suite: the trainer's defaults (no flag but --env) on a set of tasks, N seeds each.

    python scripts/suite.py --seeds 3                        # every task, writes docs/suite.md and docs/suite.png
    python scripts/suite.py --tasks cartpole,pendulum --seeds 1 --out /tmp/suite
    python scripts/suite.py --seeds 3 --long_seeds 1         # 1 seed for the tasks of 10 minutes

Every run is `python -m appo.train --env=ENV --seed=S --train_for_seconds=BUDGET` (plus `--target_reward` for a
task with a threshold, so a run stops once solved; plus `--experiment_summaries_interval=1`, so that short runs
draw curves; plus the task's own flags, which only the memory pair has:
--use_rnn=True against the feed-forward default on the same partially observed task). For each task the table
gives, over the seeds, the median time from launch to the threshold, the median env steps to the threshold
(counted by the learner, per agent for multi-agent envs), how many seeds reached it, and the median final mean
return (the mean over the last --stats_avg episodes at the end, from each run's result.json). The PNG has one panel
of learning curves per task (mean of the seeds, the range shaded), from the runs' tensorboard summaries.
`--budget_scale` shortens every budget (a quick look, not the suite's numbers).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

from appo.tools.suite_tasks import TASKS, Task
from appo.tools.trainer_process import run_trainer

LONG_S = 600  # budgets from this many seconds on are the long tasks (--long_seeds)
SUMMARY_INTERVAL_S = 1  # tensorboard points every second: a run solved in 7 s still draws a curve


@dataclass
class Result:
    solved_s: float | None
    env_steps: int | None
    final: float | None


def run_task(name: str, task: Task, seed: int, train_dir: str, budget_scale: float) -> Result:
    flags = [f"--env={task.env}", f"--seed={seed}", f"--experiment={name}_{seed}", f"--train_dir={train_dir}",
             f"--train_for_seconds={task.budget_s * budget_scale:g}", "--restart=True",
             f"--experiment_summaries_interval={SUMMARY_INTERVAL_S:g}", *task.flags]
    if task.threshold is not None:
        flags.append(f"--target_reward={task.threshold:g}")
    print("python -m appo.train " + " ".join(flags), flush=True)
    run = run_trainer(flags)
    if run.returncode != 0:
        raise SystemExit(f"{name} seed {seed}: the trainer failed (exit {run.returncode})")
    return Result(run.solved_s, run.solved_env_steps, run.result.final_reward())


def median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def table(results: dict[str, list[Result]], budget_scale: float) -> str:
    rows = ["| task | env | threshold | budget | solved | time to threshold | env steps to threshold | final return |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, runs in results.items():
        task = TASKS[name]
        solved = [r for r in runs if r.solved_s is not None]
        solved_text = "-" if task.threshold is None else f"{len(solved)} of {len(runs)}"
        seconds, steps = median_or_none([r.solved_s for r in solved]), median_or_none([r.env_steps for r in solved])
        final = median_or_none([r.final for r in runs])
        env = task.env + ("".join(f" `{flag}`" for flag in task.flags))
        rows.append(
            f"| {name} | {env} | {'-' if task.threshold is None else f'{task.threshold:g}'} | "
            f"{task.budget_s * budget_scale:g} s | {solved_text} | "
            f"{'-' if seconds is None else f'{seconds:.1f} s'} | {'-' if steps is None else f'{steps:,.0f}'} | "
            f"{'-' if final is None else f'{final:.1f}'} |")
    return "\n".join(rows)


def curves(results: dict[str, list[Result]], train_dir: str, out: str) -> None:
    from appo.tools.plot import draw, panels

    def draw_task(ax, name: str) -> None:
        draw(ax, [os.path.join(train_dir, f"{name}_{seed}") for seed in range(len(results[name]))])
        threshold = TASKS[name].threshold
        if threshold is not None:
            ax.axhline(threshold, color="grey", linestyle="--", linewidth=1)
        ax.set_title(name)
        ax.set_ylabel("mean return")

    panels(list(results), out, draw_task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"Comma-separated, of: {', '.join(TASKS)}.")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--long_seeds", type=int, default=None,
                        help=f"Seeds of the tasks with budgets of {LONG_S / 60:g} minutes or more (default: --seeds).")
    parser.add_argument("--budget_scale", type=float, default=1.0, help="Multiplies every task's time budget.")
    parser.add_argument("--train_dir", default="train_dir/suite")
    parser.add_argument("--out", default="docs", help="Folder for suite.md and suite.png.")
    args = parser.parse_args()
    if args.seeds < 1 or (args.long_seeds is not None and args.long_seeds < 1) or not args.budget_scale > 0:
        parser.error("--seeds and --long_seeds must be 1 or more, --budget_scale more than 0")
    names = args.tasks.split(",")
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)}; use {', '.join(TASKS)}")
    started = time.monotonic()
    results: dict[str, list[Result]] = {}
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        long = TASKS[name].budget_s >= LONG_S and args.long_seeds is not None
        results[name] = [run_task(name, TASKS[name], seed, args.train_dir, args.budget_scale)
                         for seed in range(args.long_seeds if long else args.seeds)]
        print(f"{name}: {results[name]}", flush=True)
        markdown = write(results, args, (time.monotonic() - started) / 60)  # after every task: a long suite cut
    print(markdown)                                                        # short keeps what it has


def write(results: dict[str, list[Result]], args: argparse.Namespace, minutes: float) -> str:
    """suite.md and suite.png of the tasks run so far; returns the table."""
    markdown = table(results, args.budget_scale)
    seeds = f"{args.seeds} seeds" + ("" if args.long_seeds is None else
                                     f", {args.long_seeds} for budgets of {LONG_S / 60:g} min or more")
    command = "python scripts/suite.py " + " ".join(sys.argv[1:])
    with open(os.path.join(args.out, "suite.md"), "w") as f:
        f.write(f"# Benchmark suite (defaults, {seeds}, medians)\n\n"
                f"`{command}` on a {os.cpu_count()}-core machine, "
                f"{time.strftime('%Y-%m-%d')}, {minutes:.0f} min in all.\n\n{markdown}\n\n"
                "![learning curves](suite.png)\n")
    curves(results, args.train_dir, os.path.join(args.out, "suite.png"))
    return markdown

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("suite: interrupted (the trainer running was stopped as Ctrl-C stops it)")
