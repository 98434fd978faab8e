"""Soak benchmark: one long CartPole run, the resident memory of every process sampled each minute.

Reports each process's RSS growth from minute --from_minute to the end (target: < 5%), and the throughput over
the last minute against the minute ending at --from_minute (target: within 10%). RSS includes the shared
pages a process has touched (trajectory buffers, queue rings), so the private part (RssAnon, where a leak
would show) is reported next to it.

    python scripts/soak.py --minutes 60 -- --env=CartPole-v1 --num_workers=4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time

import psutil

from appo.tools.watched_run import WatchedRun, save_json


def memory_mb(run: WatchedRun) -> dict[str, dict[str, float]]:
    """Per process: RSS, and its private anonymous part (RssAnon in /proc/<pid>/status), in MB."""
    processes = {"runner": psutil.Process(run.process.pid), **run.workers()}
    memory = {"rss": {}, "anon": {}}
    for name, process in processes.items():
        with contextlib.suppress(psutil.NoSuchProcess, FileNotFoundError):
            memory["rss"][name] = process.memory_info().rss / 2**20
            with open(f"/proc/{process.pid}/status") as f:
                anon_kb = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
            memory["anon"][name] = anon_kb / 2**10
    return memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--from_minute", type=int, default=5)
    parser.add_argument("--out", type=str, default=None, help="Write the per-minute samples as JSON here.")
    parser.add_argument("trainer_args", nargs="*",
                        help="after --: flags for the trainer (default --env=CartPole-v1 --num_workers=4)")
    args = parser.parse_args()
    if not 1 <= args.from_minute < args.minutes:
        parser.error(f"--from_minute={args.from_minute} must be from 1 to under --minutes={args.minutes}")
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
                      **memory_mb(run)}
            minutes.append(sample)
            print(json.dumps(sample), flush=True)
        code = run.wait()
    if code != 0 or len(minutes) < args.minutes:
        print(f"the run ended early (exit code {code}):\n{''.join(run.lines[-20:])}", file=sys.stderr)
        sys.exit(1)
    start, end = minutes[args.from_minute - 1], minutes[-1]
    a, b = args.from_minute, args.minutes
    print(f"\n| process | RSS min {a} (MB) | RSS min {b} (MB) | growth | private min {a} (MB) | private min {b} (MB) "
          f"| growth |")
    print("|---|---|---|---|---|---|---|")
    for name in sorted(start["rss"]):
        if name in end["rss"] and name in end["anon"]:
            rss, anon = (start["rss"][name], end["rss"][name]), (start["anon"][name], end["anon"][name])
            print(f"| {name} | {rss[0]:.1f} | {rss[1]:.1f} | {(rss[1] - rss[0]) / rss[0]:+.1%} | {anon[0]:.1f} "
                  f"| {anon[1]:.1f} | {(anon[1] - anon[0]) / anon[0]:+.1%} |")
    fps_start, fps_end = start["fps_last_minute"], end["fps_last_minute"]
    print(f"\nframes/s over minute {args.from_minute}: {fps_start:,.0f}; over minute {args.minutes}: {fps_end:,.0f} "
          f"({(fps_end - fps_start) / fps_start:+.1%})")
    if args.out:
        save_json(args.out, minutes)


if __name__ == "__main__":
    main()
