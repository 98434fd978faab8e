"""Chaos benchmark: a CartPole run with faults against the same run without.

--fault=kill: a random worker is killed with SIGKILL at --first_kill seconds (while CartPole is still
learning) and then every --kill_every seconds. Every kill picks a role (actor, inference worker or learner)
at random, then one process of that role.
--fault=flaky_env: every env raises in `step` once every 2k-20k of its steps (tests/flaky_envs.py).
--fault=ranks: learner ranks (--learner_processes_per_policy=2) against a fault-free run of them, each run to
--steps env steps: two runs at once (each must meet on a port of its own), rank 1 SIGKILLed while its group starts
(as soon as it has a connection to its rank 0), and rank 1 SIGKILLed mid-run (at --first_kill seconds).
--fault=mlflow: a run tracked by a local `mlflow server` (started here, SQLite store) that is SIGKILLed at
--first_kill seconds and restarted on the same port, against the same run with the server up throughout.

The ranks and mlflow cases report, each: its exit code, its wall time and the time lost against the fault-free run,
the log's line about the fault, and what the run left behind (processes, /dev/shm segments). The others give, per
pair of runs: throughput over the whole run with and without faults, when each run
first reached a mean reward of --target, its lowest mean reward after that, and its final mean reward, the
number of lines each printed, and
for every kill the time until the throughput (over 2 s) is back to 90% of the fault-free run's steady
throughput.

    python scripts/chaos.py --runs 1 --seconds 300 -- --env=CartPole-v1
    python scripts/chaos.py --fault=flaky_env --runs 3 --seconds 60
    python scripts/chaos.py --fault=ranks --steps 100000
    python scripts/chaos.py --fault=mlflow --steps 100000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator

import psutil

from appo.tools.watched_run import WatchedRun, save_json

ROLES = ("actor", "inference", "learner")
FOLLOWER = "learner_p0_r1"
RANKS = ["--learner_processes_per_policy=2"]
SERVER_START_S = 120.0  # mlflow server takes a while to answer on a busy machine
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


def wait_until(condition: Callable[[], object], seconds: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def joining(run: WatchedRun) -> bool:
    """Rank 1 has a TCP connection (to its rank 0) and is not yet past its group's start: it is SIGKILLed."""
    follower = run.workers().get(FOLLOWER)
    with contextlib.suppress(psutil.NoSuchProcess):
        if follower and any(c.status == psutil.CONN_ESTABLISHED for c in follower.net_connections("tcp")):
            os.kill(follower.pid, signal.SIGKILL)
            return True
    return run.process.poll() is not None


def kill_at(run: WatchedRun, seconds: float, name: str) -> bool:
    """SIGKILL worker `name` once the run is `seconds` old."""
    if run.elapsed() < seconds:
        return False
    worker = run.workers().get(name)
    if worker:
        os.kill(worker.pid, signal.SIGKILL)
    return worker is not None or run.process.poll() is not None


def leftovers(run: WatchedRun) -> str:
    """What the ended run left: its processes (every worker is a fork of the runner, with its command line) and its
    /dev/shm segments (named after the runner's pid)."""
    mine = [proc.pid for proc in psutil.process_iter(["cmdline"])
            if f"--experiment={os.path.basename(run.exp_dir)}" in (proc.info["cmdline"] or [])
            and any(os.path.dirname(run.exp_dir) in part for part in proc.info["cmdline"] or [])]
    segments = [name for name in os.listdir("/dev/shm") if name.startswith(f"appo_{run.process.pid}_")]
    return f"{len(mine)} processes, {len(segments)} /dev/shm segments"


def case_result(case: str, run: WatchedRun, free_wall: float | None, pattern: str) -> dict:
    """One fault case's line of the report: the log's first line with `pattern` (any case) says what it did."""
    wall = run.samples[-1].t if run.samples else run.elapsed()
    said = next((line.strip() for line in run.lines if pattern.lower() in line.lower()), "(nothing)")
    return {"case": case, "exit_code": run.process.returncode, "wall_s": round(wall, 1),
            "lost_s": None if free_wall is None else round(wall - free_wall, 1), "log": said,
            "final_reward": run.result().final_reward(),
            "restarts": next((line.strip() for line in reversed(run.lines) if "restarts:" in line), ""),
            "left_behind": leftovers(run)}


def watched(args: list[str], fault: Callable[[WatchedRun], bool] | None = None) -> WatchedRun:
    """The run to its end; `fault(run)` is called every 50 ms until it returns True (it did its harm)."""
    run = WatchedRun(args)
    while fault is not None and not fault(run):
        time.sleep(0.05)
    run.wait()
    return run


def rank_cases(common: list[str], first_kill: float) -> list[dict]:
    free = watched(["--experiment=free", *common, *RANKS])
    free_wall = free.samples[-1].t
    results = [case_result("fault-free, 2 ranks", free, None, "meeting on port")]
    together = [WatchedRun([f"--experiment=together_{i}", *common, *RANKS]) for i in range(2)]
    for i, run in enumerate(together):
        run.wait()
        results.append(case_result(f"two runs at once, run {i}", run, free_wall, "meeting on port"))
    start = watched(["--experiment=start_kill", *common, *RANKS], joining)
    results.append(case_result("rank 1 SIGKILLed at group start", start, free_wall, f"{FOLLOWER} died"))
    mid = watched(["--experiment=mid_kill", *common, *RANKS], lambda run: kill_at(run, first_kill, FOLLOWER))
    results.append(case_result(f"rank 1 SIGKILLed at {first_kill:g} s", mid, free_wall, f"{FOLLOWER} died"))
    return results


@contextlib.contextmanager
def mlflow_server(folder: str) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """`mlflow server` on a free loopback port with a SQLite store in `folder`: its URL, a SIGKILL of the server (its
    whole session) and a restart on the same port and store."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url, servers = f"http://127.0.0.1:{port}", []

    def start() -> None:
        log_file = open(os.path.join(folder, "server.log"), "a")  # noqa: SIM115 (the server's, until it ends)
        servers.append(subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{folder}/server.db", "--artifacts-destination",
             os.path.join(folder, "artifacts")], stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}))  # its job runner leaves /dev/shm
        if not wait_until(lambda: mlflow_get(url, "/api/2.0/mlflow/experiments/search?max_results=1"),
                          SERVER_START_S, 0.5):
            raise RuntimeError(f"mlflow server on {url} did not answer within {SERVER_START_S:g} s")

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(servers[-1].pid, signal.SIGKILL)
        servers[-1].wait()

    start()
    try:
        yield url, kill, start
    finally:
        kill()


def mlflow_get(url: str, path: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=10) as answer:
            return json.load(answer)
    except OSError:
        return None


def tracked_steps(url: str, run: WatchedRun) -> int | None:
    """The highest step of any metric the server holds for the run (None: it holds no run of it)."""
    with contextlib.suppress(OSError, KeyError, ValueError):
        with open(os.path.join(run.exp_dir, "tracking.json")) as f:
            run_id = json.load(f)["mlflow"]["run_id"]
        answer = mlflow_get(url, f"/api/2.0/mlflow/runs/get?run_id={run_id}")
        return max(int(metric["step"]) for metric in answer["run"]["data"]["metrics"])
    return None


def mlflow_cases(common: list[str], first_kill: float, folder: str) -> list[dict]:
    with mlflow_server(folder) as (url, kill, restart):
        tracked = [*common, "--with_mlflow=True", f"--mlflow_tracking_uri={url}"]
        free = watched(["--experiment=free", *tracked])
        results = [case_result("mlflow server up throughout", free, None, "mlflow") | {
            "server_steps": tracked_steps(url, free)}]

        def kill_and_restart(run: WatchedRun) -> bool:
            if run.elapsed() < first_kill:
                return False
            kill()
            restarted_at = run.elapsed()
            restart()
            print(f"mlflow server killed at {first_kill:g} s, answering again at {run.elapsed():.1f} s "
                  f"({run.elapsed() - restarted_at:.1f} s to start)", flush=True)
            return True

        chaos = watched(["--experiment=server_killed", *tracked], kill_and_restart)
        results.append(case_result(f"mlflow server SIGKILLed at {first_kill:g} s and restarted", chaos,
                                   free.samples[-1].t, "mlflow") | {"server_steps": tracked_steps(url, chaos)})
    return results


def print_cases(results: list[dict]) -> None:
    print("\n| case | exit code | wall (s) | lost vs fault-free (s) | final reward | the log said | restarts "
          "| left behind |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['case']} | {r['exit_code']} | {r['wall_s']} | {r['lost_s']} | {r['final_reward']} "
              f"| {r['log'][-200:]} | {r['restarts']} | {r['left_behind']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", choices=("kill", "flaky_env", "ranks", "mlflow"), default="kill")
    parser.add_argument("--runs", type=int, default=1, help="Pairs of runs (fault-free, with faults).")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--steps", type=int, default=100000, help="The env steps of each run of --fault=ranks/mlflow.")
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
        if args.fault in ("ranks", "mlflow"):
            common = [f"--train_dir={train_dir}", f"--train_for_env_steps={args.steps}", "--report_interval=1",
                      *trainer_args]
            cases = (rank_cases(common, args.first_kill) if args.fault == "ranks" else
                     mlflow_cases(common, args.first_kill, train_dir))
            for case in cases:
                print(json.dumps(case, indent=1), flush=True)
            print_cases(cases)
            if args.out:
                save_json(args.out, cases)
            return
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
