"""Chaos benchmark: a CartPole run with faults against the same run without.

--fault=kill: a random worker is killed with SIGKILL at --first_kill seconds (while CartPole is still
learning) and then every --kill_every seconds. Every kill picks a role (actor, inference worker or learner)
at random, then one process of that role.
--fault=flaky_env: every env raises in `step` once every 2k-20k of its steps (tests/flaky_envs.py).

The report gives, per pair of runs: throughput over the whole run with and without faults, when each run
first reached a mean reward of --target, its lowest mean reward after that, and its final mean reward, the
number of lines each printed, and
for every kill the time until the throughput (over 2 s) is back to 90% of the fault-free run's steady
throughput.

    python scripts/chaos.py --runs 1 --seconds 300 -- --env=CartPole-v1
    python scripts/chaos.py --fault=flaky_env --runs 3 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import tempfile
import time

from appo.tools.watched_run import WatchedRun, save_json

ROLES = ("actor", "inference", "learner")
RECOVERED = 0.9  # of the fault-free steady throughput
FLAKY_ENV = ["--env=tests.flaky_envs:make_flaky_cartpole", '--env_kwargs={"min_steps": 2000, "max_steps": 20000}']


def fault_free(args: list[str]) -> WatchedRun:
    run = WatchedRun(args)
    run.wait()
    return run


def with_kills(args: list[str], seconds: float, first_kill: float, kill_every: float, rng: random.Random
               ) -> tuple[WatchedRun, list[tuple[float, str]]]:
    """The run, and (seconds since launch, worker name) of every kill."""
    run = WatchedRun(args)
    kills = []
    next_kill = first_kill
    while run.process.poll() is None:
        time.sleep(0.05)
        if run.elapsed() < next_kill or run.elapsed() > seconds - 2:
            continue
        workers = run.workers()
        role = rng.choice(ROLES)
        candidates = sorted(name for name in workers if name.startswith(role))
        if candidates:
            name = rng.choice(candidates)
            try:
                os.kill(workers[name].pid, signal.SIGKILL)
                kills.append((run.elapsed(), name))
            except ProcessLookupError:
                pass
        next_kill += kill_every
    run.wait()
    return run, kills


def recovery_seconds(run: WatchedRun, kill_at: float, full_fps: float, window: float = 2.0) -> float | None:
    """Time from a kill until the throughput over `window` seconds is back to RECOVERED x full_fps."""
    for sample in run.samples:
        if sample.t < kill_at:
            continue
        if run.fps(sample.t, sample.t + window) >= RECOVERED * full_fps:
            return sample.t - kill_at
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", choices=("kill", "flaky_env"), default="kill")
    parser.add_argument("--runs", type=int, default=1, help="Pairs of runs (fault-free, with faults).")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--first_kill", type=float, default=5.0)
    parser.add_argument("--kill_every", type=float, default=20.0)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=str, default=None, help="Write the measurements as JSON here.")
    parser.add_argument("trainer_args", nargs="*", help="after --: flags for the trainer (default --env=CartPole-v1)")
    args = parser.parse_args()
    trainer_args = args.trainer_args or ["--env=CartPole-v1"]
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory() as train_dir:
        for i in range(args.runs):
            common = [f"--train_dir={train_dir}", f"--train_for_seconds={args.seconds}", "--report_interval=1",
                      "--max_worker_restarts=1000", *trainer_args]
            free = fault_free([f"--experiment=free_{i}", *common])
            if args.fault == "kill":
                chaos, kills = with_kills([f"--experiment=chaos_{i}", *common], args.seconds, args.first_kill,
                                          args.kill_every, rng)
            else:  # the flaky env's flags come last, so they win over an --env in trainer_args
                chaos, kills = fault_free([f"--experiment=chaos_{i}", *common, *FLAKY_ENV]), []
            full_fps = free.steady_fps()
            result = {
                "fault_free_fps": free.fps(), "chaos_fps": chaos.fps(), "ratio": chaos.fps() / max(free.fps(), 1e-9),
                "fault_free_steady_fps": full_fps,
                "fault_free_reached_target_s": free.first_reward_at_least(args.target),
                "chaos_reached_target_s": chaos.first_reward_at_least(args.target),
                "fault_free_final_reward": free.result().final_reward(),
                "chaos_final_reward": chaos.result().final_reward(),
                "chaos_lowest_reward_after_target": chaos.lowest_reward_after(args.target),
                "chaos_exit_code": chaos.process.returncode,
                "fault_free_log_lines": len(free.lines), "chaos_log_lines": len(chaos.lines),
                "chaos_env_errors": chaos.last_count("env errors"),
                "restarts_line": next((line.strip() for line in reversed(chaos.lines) if "restarts:" in line), ""),
                "kills": [{"at_s": round(t, 1), "worker": name,
                           "recovered_s": recovery_seconds(chaos, t, full_fps)} for t, name in kills],
            }
            results.append(result)
            print(json.dumps(result, indent=1), flush=True)
    print(f"\n| run | fault-free frames/s | with faults frames/s | ratio | kills | reached {args.target:g} (s) "
          f"| lowest reward after | final reward | env errors | log lines (fault-free / faults) "
          f"| median recovery (s) | slowest recovery (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(results):
        recoveries = [k["recovered_s"] for k in r["kills"] if k["recovered_s"] is not None]
        unrecovered = sum(k["recovered_s"] is None for k in r["kills"])
        print(f"| {i} | {r['fault_free_fps']:,.0f} | {r['chaos_fps']:,.0f} | {r['ratio']:.1%} | {len(r['kills'])} "
              f"| {r['chaos_reached_target_s']} | {r['chaos_lowest_reward_after_target']} | {r['chaos_final_reward']} "
              f"| {r['chaos_env_errors']} "
              f"| {r['fault_free_log_lines']} / {r['chaos_log_lines']} "
              f"| {statistics.median(recoveries) if recoveries else None} "
              f"| {max(recoveries) if recoveries else None}{f' ({unrecovered} never)' if unrecovered else ''} |")
    if args.out:
        save_json(args.out, results)


if __name__ == "__main__":
    main()
