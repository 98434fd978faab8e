"""The PBT benchmark: does population-based training help, and does it do no harm, on tasks it was not tuned on?

Every task is trained from three starts, each in three arms, N seeds each:
- starts: `default` (the trainer's defaults), `lr_low` (--learning_rate 100x below the task's default: 1e-3, or
  appo/config/auto.py IMAGE_LEARNING's for image observations), `lambda_low` (--gae_lambda=0.5);
- arms: `single` (one policy with the whole machine), `population` (--num_policies=4, no PBT) and `pbt`
  (--num_policies=4 --with_pbt=True; `--population N` for another size). The last two run for the same wall
  time on the same workers, so they also take about the same total env steps.
Tasks and thresholds (mean return over the last --stats_avg episodes of the best policy): cartpole
(CartPole-v1, 475), lunarlander (LunarLander-v3, 200), pendulum (Pendulum-v1, -200), mountaincar_continuous
(MountainCarContinuous-v0, 90), as in scripts/suite.py, and catch (envs/catch.py, 9: 95% of the balls caught;
random play averages about -6). Each task has one budget, longer than the suite's so that a bad start can
be rescued; every run stops at the threshold (--target_reward).

Each run is `python -m appo.train --env=ENV --seed=S --train_for_seconds=BUDGET --target_reward=THRESHOLD
--restart=True` plus the start's and the arm's flags. It records: the time from launch to the best policy
reaching the threshold (None: not within the budget), env steps (all policies', to the threshold or in the
whole budget), and the best and mean over the policies of their final mean return. Records are appended to
OUT/pbt_suite.jsonl as each run ends, so a benchmark that is stopped keeps what it finished; `--resume`
skips the runs already there. The report (also written at the end of a benchmark) is OUT/pbt_suite.md, per
task and start, per arm: solved k of n, the median time to threshold (an unsolved run counts as slower than
any solved one, so a median over mostly unsolved runs is "> budget") and the median final best return; and
OUT/pbt_suite.png, one panel per task, bars of that median time per start and arm, hatched at the budget
where the median run did not solve.

    python scripts/pbt_suite.py --seeds 3 --out docs/pbt_suite      # everything: 135 runs, at most about 15 h
    python scripts/pbt_suite.py --seeds 3 --out docs/pbt_suite --resume                 # go on after a stop
    python scripts/pbt_suite.py --tasks cartpole,catch --starts default,lr_low --seeds 1 --out /tmp/pbt
    python scripts/pbt_suite.py --out docs/pbt_suite --report       # only re-read the records, rewrite the report
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from collections.abc import Iterable

from appo.config.auto import IMAGE_LEARNING, has_images
from appo.config.flags import Config
from appo.envs import env_info
from appo.tools.suite_tasks import TASKS, Task
from appo.tools.trainer_process import run_trainer

# The suite's tasks (env and threshold) with this benchmark's budgets: time for a bad start to be rescued.
PBT_TASKS = {
    "cartpole": dataclasses.replace(TASKS["cartpole"], budget_s=180),  # PBT from lr 1e-5: median 88 s (issue 26)
    "lunarlander": dataclasses.replace(TASKS["lunarlander"], budget_s=600),
    "pendulum": dataclasses.replace(TASKS["pendulum"], budget_s=300),
    "mountaincar_continuous": dataclasses.replace(TASKS["mountaincar_continuous"], budget_s=300),
    "catch": Task("catch", 9, 180),  # the defaults reach 9 in about 20 s
}
STARTS = ("default", "lr_low", "lambda_low")
POPULATION = 4  # policies of the population arms, unless --population says otherwise
ARMS = ("single", "population", "pbt")


def arm_flags(arm: str, population: int) -> list[str]:
    """One policy with the whole machine, or `population` policies without or with PBT."""
    if arm == "single":
        return []
    return [f"--num_policies={population}", f"--with_pbt={arm == 'pbt'}"]
RECORDS = "pbt_suite.jsonl"


def start_flags(start: str, env: str) -> list[str]:
    """The flags of a start on this env: none, a learning rate 100x below the env's default, or GAE lambda 0.5."""
    if start == "lr_low":
        default = IMAGE_LEARNING["learning_rate"] if has_images(env_info(env)) else Config.learning_rate
        return [f"--learning_rate={default / 100:g}"]
    return ["--gae_lambda=0.5"] if start == "lambda_low" else []


def run_key(record: dict) -> tuple[str, str, str, int]:
    return record["task"], record["start"], record["arm"], record["seed"]


def pending(plan: Iterable[tuple[str, str, str, int]], records: list[dict]) -> list[tuple[str, str, str, int]]:
    """The planned runs (task, start, arm, seed) that have no record yet, in the plan's order."""
    done = {run_key(record) for record in records}
    return [key for key in plan if key not in done]


def load_records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_one(task_name: str, start: str, arm: str, seed: int, train_dir: str, budget_scale: float,
            population: int = POPULATION) -> dict:
    """One trainer run and its record; a trainer that fails stops the benchmark (what finished is kept)."""
    task = PBT_TASKS[task_name]
    budget_s = task.budget_s * budget_scale
    flags = [f"--env={task.env}", f"--seed={seed}", f"--experiment={task_name}_{start}_{arm}_{seed}",
             f"--train_dir={train_dir}", f"--train_for_seconds={budget_s:g}", f"--target_reward={task.threshold:g}",
             "--restart=True", *start_flags(start, task.env), *arm_flags(arm, population)]
    print("python -m appo.train " + " ".join(flags), flush=True)
    run = run_trainer(flags)
    if run.returncode != 0:
        raise SystemExit(f"{task_name} {start} {arm} seed {seed}: the trainer failed (exit {run.returncode}); "
                         "rerun with --resume to go on")
    rewards = [run.result.final_reward(policy) for policy in run.result.stats]
    return {"task": task_name, "start": start, "arm": arm, "seed": seed,
            "policies": 1 if arm == "single" else population, "budget_s": budget_s,
            "threshold": task.threshold, "solved_s": run.solved_s,
            "env_steps": run.solved_env_steps if run.solved_env_steps is not None else run.result.env_steps,
            "final_best": max(rewards, default=None),
            "final_mean": round(statistics.fmean(rewards), 3) if rewards else None}


def median_time(runs: list[dict]) -> float:
    """The median run's time to threshold, inf when that run did not solve (unsolved runs count as slowest;
    of an even number of runs, the slower middle one)."""
    return statistics.median_high([run["solved_s"] if run["solved_s"] is not None else float("inf") for run in runs])


def arm_cell(runs: list[dict]) -> str:
    """'k of n, median time, best median final best return' of one arm's runs, or '-' when it has none."""
    if not runs:
        return "-"
    solved = sum(run["solved_s"] is not None for run in runs)
    seconds = median_time(runs)
    time_text = f"> {max(run['budget_s'] for run in runs):g} s" if seconds == float("inf") else f"{seconds:.1f} s"
    bests = [run["final_best"] for run in runs if run["final_best"] is not None]
    best_text = f"{statistics.median(bests):.1f}" if bests else "-"
    return f"{solved} of {len(runs)}, {time_text}, best {best_text}"


def grouped(records: list[dict]) -> dict[tuple[str, str], dict[str, list[dict]]]:
    """Records by (task, start) in the benchmark's order, then by arm."""
    groups: dict[tuple[str, str], dict[str, list[dict]]] = {}
    order = {name: i for i, name in enumerate([*PBT_TASKS, *STARTS])}
    for record in sorted(records, key=lambda r: (order.get(r["task"], 99), order.get(r["start"], 99), r["seed"])):
        groups.setdefault((record["task"], record["start"]), {}).setdefault(record["arm"], []).append(record)
    return groups


def table(records: list[dict]) -> str:
    """The Markdown table: one row per task and start, one column per arm."""
    rows = [f"| task | start | threshold | budget | {' | '.join(ARMS)} |",
            "| --- | --- | --- | --- |" + " --- |" * len(ARMS)]
    for (task, start), arms in grouped(records).items():
        runs = [run for arm_runs in arms.values() for run in arm_runs]
        budget = max(run["budget_s"] for run in runs)
        cells = " | ".join(arm_cell(arms.get(arm, [])) for arm in ARMS)
        rows.append(f"| {task} | {start} | {runs[0]['threshold']:g} | {budget:g} s | {cells} |")
    return "\n".join(rows)


def plot(records: list[dict], path: str) -> None:
    """One panel per task: per start, a bar per arm of the median time to threshold; hatched at the budget
    when the median run did not solve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    groups = grouped(records)
    tasks = list(dict.fromkeys(task for task, _ in groups))
    fig, axes = plt.subplots(1, len(tasks), figsize=(max(4.2 * len(tasks), 7), 4), squeeze=False)
    width = 0.8 / len(ARMS)
    for ax, task in zip(axes[0], tasks):
        starts = [start for t, start in groups if t == task]
        for i, arm in enumerate(ARMS):
            for x, start in enumerate(starts):
                runs = groups[task, start].get(arm)
                if not runs:
                    continue
                seconds = median_time(runs)
                unsolved = seconds == float("inf")
                ax.bar(x + (i - (len(ARMS) - 1) / 2) * width, max(r["budget_s"] for r in runs) if unsolved else seconds,
                       width, color=f"C{i}", hatch="xx" if unsolved else None, alpha=0.5 if unsolved else 1.0)
        ax.set_xticks(range(len(starts)), starts)
        ax.set_title(task)
        ax.set_ylabel("median time to threshold (s)")
    legend = [Patch(color=f"C{i}", label=arm) for i, arm in enumerate(ARMS)]
    legend.append(Patch(facecolor="white", edgecolor="grey", hatch="xx", label="not solved: the budget"))
    fig.legend(handles=legend, loc="upper center", ncol=len(legend), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(records: list[dict], out: str) -> str:
    """OUT/pbt_suite.md and OUT/pbt_suite.png from the records; returns the table."""
    markdown = table(records)
    seeds = len({record["seed"] for record in records})
    with open(os.path.join(out, "pbt_suite.md"), "w") as f:
        f.write(f"# PBT benchmark (up to {seeds} seeds per cell, {os.cpu_count()}-core machine)\n\n"
                "Each cell: runs that reached the threshold, median time from launch to the best policy reaching "
                "it, median final return of the best policy. Made by `python scripts/pbt_suite.py` (see its "
                f"docstring).\n\n{markdown}\n\n![median time to threshold](pbt_suite.png)\n")
    plot(records, os.path.join(out, "pbt_suite.png"))
    return markdown


def choices(parser: argparse.ArgumentParser, flag: str, text: str, valid: Iterable[str]) -> list[str]:
    names, valid = text.split(","), list(valid)
    unknown = [name for name in names if name not in valid]
    if unknown:
        parser.error(f"{flag}: unknown {', '.join(unknown)}; use {', '.join(valid)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(PBT_TASKS), help=f"Comma-separated, of: {', '.join(PBT_TASKS)}.")
    parser.add_argument("--starts", default=",".join(STARTS), help=f"Comma-separated, of: {', '.join(STARTS)}.")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"Comma-separated, of: {', '.join(ARMS)}.")
    parser.add_argument("--seeds", type=int, default=3, help="Seeds 0 to N-1 of every task, start and arm.")
    parser.add_argument("--budget_scale", type=float, default=1.0, help="Multiplies every task's time budget.")
    parser.add_argument("--out", default="train_dir/pbt_suite", help=f"Folder for {RECORDS} and the report.")
    parser.add_argument("--train_dir", default="train_dir/pbt_suite_runs")
    parser.add_argument("--population", type=int, default=POPULATION, help="Policies of the population and pbt arms.")
    parser.add_argument("--resume", action="store_true", help=f"Skip the runs already in OUT/{RECORDS}.")
    parser.add_argument("--report", action="store_true", help="Run nothing: rewrite the report from the records.")
    args = parser.parse_args()
    if args.seeds < 1 or args.population < 1 or not args.budget_scale > 0:
        parser.error("--seeds and --population must be 1 or more, --budget_scale more than 0")
    path = os.path.join(args.out, RECORDS)
    records = load_records(path)
    if args.report:
        if not records:
            parser.error(f"{path}: no records to report")
        print(write_report(records, args.out))
        return
    if records and not args.resume:
        parser.error(f"{path} has {len(records)} runs already: --resume to go on, --report to rewrite the report, "
                     "or another --out")
    plan = [(task, start, arm, seed) for task in choices(parser, "--tasks", args.tasks, PBT_TASKS)
            for start in choices(parser, "--starts", args.starts, STARTS)
            for arm in choices(parser, "--arms", args.arms, ARMS) for seed in range(args.seeds)]
    os.makedirs(args.out, exist_ok=True)
    todo = pending(plan, records)
    print(f"{len(todo)} of {len(plan)} runs to go", flush=True)
    for key in todo:
        record = run_one(*key, args.train_dir, args.budget_scale, args.population)
        print(json.dumps(record), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
        records.append(record)
    print(write_report(records, args.out))


if __name__ == "__main__":
    main()
