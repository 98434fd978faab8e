"""Time-to-solve benchmark: launch the trainer N times and time each run until it reaches the target.

Each run is a fresh `python -m appo.train` process with `--target_reward` (the runner stops the
moment the mean reward over the last --stats_avg episodes reaches it). The time is the one its result.json
records for the target: from the trainer process's start, so start-up is included.

    python scripts/time_to_solve.py --runs 3 -- --env=CartPole-v1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from appo.tools.trainer_process import run_trainer
from appo.utils.process import EXIT_BAD_INPUT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", type=float, default=475.0, help="Mean reward over the last 100 episodes.")
    parser.add_argument("--limit_s", type=float, default=60.0, help="A run that has not solved by then failed.")
    parser.add_argument("trainer_args", nargs="*", default=["--env=CartPole-v1"],
                        help="Flags for appo.train (after --).")
    args = parser.parse_args()
    if args.runs < 1 or not args.limit_s > 0:
        parser.error(f"--runs={args.runs} must be 1 or more and --limit_s={args.limit_s:g} more than 0")
    times = []
    with tempfile.TemporaryDirectory() as train_dir:
        for index in range(args.runs):
            # --restart=True last: a --train_dir among the trainer's flags may hold a finished solve_<index>, which
            # would not train again and read as a run that never solved.
            run = run_trainer([f"--train_dir={train_dir}", f"--experiment=solve_{index}",
                               f"--target_reward={args.target}", f"--train_for_seconds={args.limit_s}",
                               *args.trainer_args, "--restart=True"])
            if run.returncode == EXIT_BAD_INPUT:  # the trainer refused its flags (run_trainer printed why): so would
                return EXIT_BAD_INPUT              # every other run
            if run.solved_s is not None:
                print(f"run {index}: {run.solved_s:.1f} s to mean reward >= {args.target}, "
                      f"{run.solved_env_steps} env steps", flush=True)
                times.append(run.solved_s)
            else:
                failed = f"failed (the trainer exited with code {run.returncode})" if run.returncode else None
                print(f"run {index}: {failed or f'not solved within {args.limit_s:.0f} s'}", flush=True)
                times.append(float("inf"))
    print(f"median time to solve over {args.runs} runs: {statistics.median(times):.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("time_to_solve: interrupted (the trainer running was stopped as Ctrl-C stops it)")
