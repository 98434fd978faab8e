"""Time-to-solve benchmark: launch the trainer N times and time each run until it reaches the target.

Each run is a fresh `python -m appo.train` process with `--target_reward` (the runner stops the
moment the mean reward over the last --stats_avg episodes reaches it). The time is measured here,
from launching the process to the trainer's line announcing the target, so start-up is included.

    python scripts/time_to_solve.py --runs 3 -- --env=CartPole-v1
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

TARGET_LINE = re.compile(r"target (?:reward|objective) .* reached .* ([0-9]+) env steps")


@dataclass
class Run:
    solved_s: float | None  # from launch to the trainer's line announcing the target
    env_steps: int | None
    output: str
    returncode: int


def run_trainer(args: list[str]) -> Run:
    """One `python -m appo.train` process with these flags, timed from launch."""
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "appo.train", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    solved_at, env_steps, lines = None, None, []
    for line in process.stdout:
        lines.append(line)
        match = TARGET_LINE.search(line)
        if match and solved_at is None:
            solved_at, env_steps = time.monotonic() - start, int(match.group(1))
    process.wait()
    if process.returncode != 0:
        print(f"trainer exited with code {process.returncode}: {''.join(lines[-5:])}", file=sys.stderr)
    return Run(solved_at, env_steps, "".join(lines), process.returncode)


def run_once(trainer_args: list[str], target: float, limit_s: float, train_dir: str, index: int
             ) -> tuple[float | None, int | None]:
    run = run_trainer([f"--train_dir={train_dir}", f"--experiment=solve_{index}", f"--target_reward={target}",
                       f"--train_for_seconds={limit_s}", *trainer_args])
    return run.solved_s, run.env_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", type=float, default=475.0, help="Mean reward over the last 100 episodes.")
    parser.add_argument("--limit_s", type=float, default=60.0, help="A run that has not solved by then failed.")
    parser.add_argument("trainer_args", nargs="*", default=["--env=CartPole-v1"],
                        help="Flags for appo.train (after --).")
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as train_dir:
        for index in range(args.runs):
            seconds, env_steps = run_once(args.trainer_args, args.target, args.limit_s, train_dir, index)
            if seconds is None:
                print(f"run {index}: not solved within {args.limit_s:.0f} s", flush=True)
                times.append(float("inf"))
            else:
                print(f"run {index}: {seconds:.1f} s to mean reward >= {args.target}, {env_steps} env steps",
                      flush=True)
                times.append(seconds)
    print(f"median time to solve over {args.runs} runs: {statistics.median(times):.1f} s")


if __name__ == "__main__":
    main()
