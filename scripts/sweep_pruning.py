"""What a sweep's pruning saves, and what its best trial is worth against the defaults.

    python scripts/sweep_pruning.py examples/sweeps/lunarlander.yaml --target_reward 200 --seeds 3
    python scripts/sweep_pruning.py examples/sweeps/acrobot.yaml --target_reward -100 --seeds 3

Three steps, each resumable (run the same command again after an interruption and finished work is kept):

1. The sweep as its file says (`python -m appo.sweep FILE`, median pruner), in <train_dir>/<study>/.
2. The same trials unpruned: a study <study>_unpruned whose enqueued trials are the finished trials' params of step 1,
   in the same order, run with `--pruner none` to their full budget. Its wall time against step 1's is what pruning
   saved; its best trial says whether pruning stopped a trial that would have won.
3. Time to `--target_reward` of step 1's best trial against the trainer's defaults (the file's flags without the
   searched ones), seeds 1..N (the sweep's trials train seed 0), alternating defaults / best, each a fresh process
   timed from launch, stopped at the target or at twice the file's budget in env steps.

Prints a markdown summary and writes it to <train_dir>/<study>/pruning.md. Nothing else may run on the machine
meanwhile: the wall times are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import optuna
import yaml
from optuna.trial import TrialState

from appo.sweep.report import wall_time
from appo.sweep.space import load_sweep, read_file
from appo.sweep.study import FINISHED, default_storage
from appo.tools.trainer_process import run_trainer
from appo.utils.files import atomic_write_text


def run_sweep(sweep_file: str, train_dir: str, *options: str) -> None:
    command = [sys.executable, "-m", "appo.sweep", sweep_file, f"--train_dir={train_dir}", *options]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)


def load(train_dir: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=default_storage(os.path.join(train_dir, name)))


def unpruned_file(sweep_file: str, train_dir: str, pruned: optuna.Study) -> str:
    """A sweep file for the finished trials of `pruned` again, unpruned, in a study of its own."""
    raw = dict(read_file(sweep_file))
    finished = pruned.get_trials(deepcopy=False, states=FINISHED)
    raw.update(study=f"{pruned.study_name}_unpruned", pruner="none", trials=len(finished),
               enqueue=[trial.params for trial in sorted(finished, key=lambda t: t.number)])
    path = os.path.join(train_dir, f"{pruned.study_name}_unpruned.yaml")
    atomic_write_text(path, yaml.safe_dump(raw, sort_keys=False))
    return path


def time_to_target(args: list[str], run_dir: str) -> dict:
    """One run of the trainer timed to the target; kept in run_dir/solve.json so that a rerun skips it."""
    path = os.path.join(run_dir, "solve.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    run = run_trainer([f"--train_dir={os.path.dirname(run_dir)}", f"--experiment={os.path.basename(run_dir)}", *args])
    if run.returncode != 0:
        raise SystemExit(f"{run_dir}: the trainer exited with code {run.returncode}")
    result = {"seconds": run.solved_s, "env_steps": run.solved_env_steps, "args": args}
    atomic_write_text(path, json.dumps(result))
    return result


def median_of(runs: list[dict], key: str) -> str:
    reached = [run[key] for run in runs if run[key] is not None]
    text = f"{statistics.median(reached):,.0f}" if len(reached) == len(runs) else "not reached"
    return f"{text} ({', '.join('-' if run[key] is None else f'{run[key]:,.0f}' for run in runs)})"


def trials_line(study: optuna.Study) -> str:
    trials = study.get_trials(deepcopy=False)
    counts = {state: sum(t.state is state for t in trials) for state in TrialState}
    env_steps = sum(t.user_attrs.get("env_steps", 0) for t in trials)
    return (f"{counts[TrialState.COMPLETE]} complete, {counts[TrialState.PRUNED]} pruned, "
            f"{counts[TrialState.FAIL]} failed; {env_steps:,} env steps trained; wall time {wall_time(trials)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file")
    parser.add_argument("--target_reward", type=float, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train_dir", default="train_dir")
    args = parser.parse_args()
    sweep = load_sweep(args.sweep_file)

    run_sweep(args.sweep_file, args.train_dir)
    pruned = load(args.train_dir, sweep.study)
    run_sweep(unpruned_file(args.sweep_file, args.train_dir, pruned), args.train_dir)
    unpruned = load(args.train_dir, f"{sweep.study}_unpruned")

    best = pruned.best_trial
    budget = 2 * sweep.flags["train_for_env_steps"]
    arms = {"defaults": {}, f"best (trial {best.number})": best.params}
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for seed in range(1, args.seeds + 1):
        for index, (arm, params) in enumerate(arms.items()):
            trainer_args = sweep.trainer_args({**params, "seed": seed, "train_for_env_steps": budget,
                                               "target_reward": args.target_reward}, [])
            run_dir = os.path.join(args.train_dir, f"{sweep.study}_to_target", f"{index}_seed{seed}")
            runs[arm].append(time_to_target(trainer_args, run_dir))

    best_unpruned = unpruned.best_trial
    same = [t.number for t in pruned.get_trials(deepcopy=False) if t.params == best_unpruned.params]
    lines = [f"# Pruning and the best trial: {sweep.study} ({sweep.env})", "",
             f"Sweep file `{args.sweep_file}`, objective `{pruned.user_attrs.get('objective')}`.", "",
             f"- Pruned (median): {trials_line(pruned)}.",
             f"- The same trials unpruned: {trials_line(unpruned)}.",
             f"- Best trial pruned: {best.number} ({best.value:.6g}, {best.params}); unpruned: pruned trial "
             f"{same[0] if same else '?'}'s params ({best_unpruned.value:.6g}, {best_unpruned.params}).", "",
             f"Time to a mean of {args.target_reward:g} from launch, seeds 1-{args.seeds} (median; each seed):", "",
             "| arm | seconds | env steps |", "| --- | ---: | ---: |"]
    lines += [f"| {arm} | {median_of(done, 'seconds')} | {median_of(done, 'env_steps')} |"
              for arm, done in runs.items()]
    text = "\n".join(lines) + "\n"
    atomic_write_text(os.path.join(args.train_dir, sweep.study, "pruning.md"), text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
