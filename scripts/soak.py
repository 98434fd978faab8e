"""Soak benchmark: one long CartPole run, the resident memory of every process sampled each minute.

Reports each process's RSS growth from minute --from_minute to the end (target: < 5%), and the throughput over
the last minute against the minute ending at --from_minute (target: within 10%).

    python scripts/soak.py --minutes 60 -- --env=CartPole-v1 --num_workers=4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from watched_run import WatchedRun  # noqa: E402


def rss_mb(run: WatchedRun) -> dict[str, float]:
    memory = {"runner": psutil.Process(run.process.pid).memory_info().rss / 2**20}
    for name, process in run.workers().items():
        with contextlib.suppress(psutil.NoSuchProcess):
            memory[name] = process.memory_info().rss / 2**20
    return memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--from_minute", type=int, default=5)
    parser.add_argument("--out", type=str, default=None, help="Write the per-minute samples as JSON here.")
    parser.add_argument("trainer_args", nargs="*",
                        help="after --: flags for the trainer (default --env=CartPole-v1 --num_workers=4)")
    args = parser.parse_args()
    trainer_args = args.trainer_args or ["--env=CartPole-v1", "--num_workers=4"]
    minutes: list[dict] = []
    with tempfile.TemporaryDirectory() as train_dir:
        run = WatchedRun([f"--train_dir={train_dir}", "--experiment=soak", "--report_interval=1",
                          f"--train_for_seconds={args.minutes * 60 + 5}", *trainer_args])
        for minute in range(1, args.minutes + 1):
            while run.elapsed() < minute * 60 and run.process.poll() is None:
                time.sleep(0.5)
            if run.process.poll() is not None:
                break
            sample = {"minute": minute, "fps_last_minute": run.fps(run.elapsed() - 60, run.elapsed()),
                      "rss_mb": rss_mb(run)}
            minutes.append(sample)
            print(json.dumps(sample), flush=True)
        code = run.wait()
    if code != 0 or len(minutes) < args.minutes:
        print(f"the run ended early (exit code {code}):\n{''.join(run.lines[-20:])}", file=sys.stderr)
        sys.exit(1)
    start, end = minutes[args.from_minute - 1], minutes[-1]
    print(f"\n| process | RSS at minute {args.from_minute} (MB) | RSS at minute {args.minutes} (MB) | growth |")
    print("|---|---|---|---|")
    for name in sorted(start["rss_mb"]):
        if name in end["rss_mb"]:
            before, after = start["rss_mb"][name], end["rss_mb"][name]
            print(f"| {name} | {before:.1f} | {after:.1f} | {(after - before) / before:+.1%} |")
    fps_start, fps_end = start["fps_last_minute"], end["fps_last_minute"]
    print(f"\nframes/s over minute {args.from_minute}: {fps_start:,.0f}; over minute {args.minutes}: {fps_end:,.0f} "
          f"({(fps_end - fps_start) / fps_start:+.1%})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(minutes, f, indent=1)


if __name__ == "__main__":
    main()
