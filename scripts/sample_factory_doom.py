"""Sample Factory 2.1.1's own VizDoom example on this machine, for the side-by-side runs of issue 27.

    python scripts/sample_factory_doom.py --scenario basic --seconds 300 --seed 0 \\
        --sf_python /work/sfvenv/bin/python --out sf_basic_0.jsonl [--sampler_only]

SF lives in its own venv (its pins and ours differ), so this script, run with the project's python, launches
`sf_examples.vizdoom.train_vizdoom --env=doom_<scenario>` there at SF's defaults for that env, adding only what
running here needs: --device=cpu, a train dir under /tmp, the seed. Training writes one JSON record per SF
summary (every 10 s; read from its tensorboard files, which SF flushes every 30 s): {"trainer", "scenario",
"seed", "time_s" since launch, "env_frames", "fps", "mean_return", "mean_episode_frames"}; --sampler_only one per
line SF prints (every second, no return). A final record has the median of SF's printed FPS readings (10-second
windows, start-up included), its effective config and what it left behind.

What SF 2.1.1 itself offers, read in its code:
- `--train_for_seconds` never fires (the runner's `total_train_seconds` stays 0), so the script stops SF at the
  budget: SIGINT to its main process (SF's Ctrl-C path: components stop, envs close, summaries flush; or SIGTERM
  with --stop_signal=TERM, as in the issue), then SIGKILL to what is left after GRACE_S.
- `--benchmark=True` still trains; it only skips the start-up decorrelation and the inference worker's cache
  cleanup. SF's sampler-only mode is `sf_examples/sampler/use_simplified_sampling_api.py` (rollout and inference
  workers, no learner, the policy fixed at its initial weights), whose entry point is Atari's; `--sampler_only`
  calls its `generate_trajectories` with SF's Doom components registered instead.
- SF counts env frames with the frameskip (4), as trained by its learner; its FPS steps by 409.6 (one 1024-sample
  batch in 10 s).
- mean_return is SF's `policy_stats/avg_true_objective` (mean of the last `--stats_avg` episodes) divided by the
  env's reward scaling (doom_basic: 0.01). SF plays its own copies of the scenarios' .cfg (same .wad): basic and
  defend_the_center reward as the vizdoom wheel's do, but SF's health_gathering gives 0.01 a tic alive and no
  death penalty (the wheel's: 1 and -100), so there mean_return is tics survived / 100 (mean_episode_frames is
  the tics); its true objective is the reward before SF's health-pickup shaping.

Stopped by SIGTERM, SF's main process dies at once and leaves its workers, the Doom engines (`vizdoom`) and their
/dev/shm entries (named after each engine's `+viz_instance_id`); killed workers leave torch's shared tensors
(/dev/shm/torch_<pid>_*). The script collects SF's processes while it runs, and after the stop kills what is
left, removes those files and prints how many there were.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import psutil

from appo.envs.doom.engine_guard import SHM_DIR, instance_id, remove_engine_shm

SCENARIOS = ("basic", "defend_the_center", "health_gathering")
EXPERIMENT = "sf"
GRACE_S = 30.0  # for SF's own shutdown after the stop signal
SETTLE_S = 5.0
TRACKER_GRACE_S = 3.0
STOP_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM}
TICK_S = 0.5
SUMMARY_POLL_S = 5.0
TAIL_LINES = 30
RETURN_TAG = "policy_stats/avg_true_objective"
FPS_TAG = "perf/_fps"
LENGTH_TAG = "len/len"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TRAIN_FPS = re.compile(r"Fps is \(10 sec: ([0-9.]+|nan),.*Total num frames: (\d+)")
SAMPLER_FPS = re.compile(r"Samples collected: (\d+), throughput: [0-9.]+ FPS \(([0-9.]+) FPS with frameskip\)")
REPORTED_CONFIG = ("num_workers", "num_envs_per_worker", "worker_num_splits", "batch_size", "num_batches_per_epoch",
                   "num_epochs", "rollout", "recurrence", "use_rnn", "env_frameskip", "res_w", "res_h",
                   "wide_aspect_ratio", "learning_rate", "stats_avg", "async_rl", "batched_sampling")

# Run inside SF's venv with `python -c CODE <SF args>`.
CONFIG_QUERY = """
import json, sys
from sf_examples.vizdoom.doom.doom_utils import doom_env_by_name
from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_components
register_vizdoom_components()
cfg = parse_vizdoom_cfg(sys.argv[1:])
print("CONFIG " + json.dumps({"reward_scaling": doom_env_by_name(cfg.env).reward_scaling, "cfg": vars(cfg)},
                              default=str))
"""
SAMPLER_ENTRY = """
import sys
from sample_factory.algo.utils.env_info import obtain_env_info_in_a_separate_process
from sf_examples.sampler.use_simplified_sampling_api import generate_trajectories
from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_components
register_vizdoom_components()
cfg = parse_vizdoom_cfg(sys.argv[1:])
sys.exit(generate_trajectories(cfg, obtain_env_info_in_a_separate_process(cfg), sample_env_steps=10**15))
"""


def sf_config(sf_python: str, sf_args: list[str]) -> tuple[float, dict]:
    """(reward scaling of the env, SF's effective config) for these arguments, as SF itself parses them."""
    result = subprocess.run([sf_python, "-c", CONFIG_QUERY, *sf_args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{sf_python} cannot parse SF's Doom config:\n{result.stderr[-3000:]}")
    line = next(line for line in result.stdout.splitlines() if line.startswith("CONFIG "))
    parsed = json.loads(line[len("CONFIG "):])
    return parsed["reward_scaling"], parsed["cfg"]


class DescendantTracker:
    """SF's processes (its workers and Doom engines), collected while SF runs: once SF's main process is gone they
    are orphans no longer under its pid."""

    def __init__(self, root_pid: int):
        self.root_pid = root_pid
        self.engines: dict[int, psutil.Process] = {}
        self.workers: dict[int, psutil.Process] = {}
        self.instance_ids: set[str] = set()

    def poll(self) -> None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.root_pid).children(recursive=True):
                if child.pid in self.engines:
                    continue
                with contextlib.suppress(psutil.Error):
                    if child.name() != "vizdoom":  # yet: an engine is a forked worker until it execs
                        self.workers.setdefault(child.pid, child)
                        continue
                    self.workers.pop(child.pid, None)
                    self.engines[child.pid] = child
                    game_id = instance_id(child.cmdline())
                    if game_id:
                        self.instance_ids.add(game_id)

    @staticmethod
    def alive(processes: dict[int, psutil.Process]) -> list[psutil.Process]:
        """Those still running: neither gone (is_running also checks pid reuse) nor zombies no one reaped."""
        running = []
        for process in processes.values():
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    running.append(process)
        return running


@dataclass
class Summary:
    """One of SF's tensorboard summaries (every --experiment_summaries_interval, 10 s), as far as issue 27 needs."""

    wall_time: float
    env_frames: int
    true_objective: float  # mean over the last --stats_avg episodes, in SF's reward units
    episode_frames: float  # mean episode length in env frames (tics)
    fps: float  # SF's 10-second env frames/s; nan if it wrote none


def summaries(accumulator, emitted: int) -> list[Summary]:
    """SF's summaries with a return in them, after the first `emitted`."""
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    if RETURN_TAG not in tags:
        return []

    def by_step(tag: str) -> dict[int, float]:  # SF writes its tags one by one: a run read early may lack some
        return {event.step: event.value for event in accumulator.Scalars(tag)} if tag in tags else {}

    fps_at, length_at = by_step(FPS_TAG), by_step(LENGTH_TAG)
    return [Summary(event.wall_time, event.step, event.value, length_at.get(event.step, math.nan),
                    fps_at.get(event.step, math.nan))
            for event in accumulator.Scalars(RETURN_TAG)[emitted:]]


def is_resource_tracker(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return any("multiprocessing.resource_tracker" in part for part in process.cmdline())
    return False


def kill(processes: list[psutil.Process]) -> None:
    """SIGKILL each and wait for them."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=10)


def remove_torch_shm(pids: list[int]) -> int:
    """Remove the /dev/shm files of torch's shared tensors that these (dead) processes made; how many."""
    removed = 0
    for pid in pids:
        for path in glob.glob(os.path.join(SHM_DIR, f"torch_{pid}_*")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += 1
    return removed


@dataclass
class StopReport:
    """What SF left running once its main process had exited (or GRACE_S had passed), all killed or removed."""

    engines: int
    sf_processes: int  # its workers
    shm_entries: int  # the engines' /dev/shm entries
    tensor_files: int  # SF's torch tensors in /dev/shm (torch_<pid>_*), left when its processes are killed
    exited_after: float | None  # seconds SF took to exit after the stop signal (0: it had already); None: killed


class SampleFactoryRun:
    """One SF run: launch, readings, stop, clean-up."""

    def __init__(self, args: argparse.Namespace, train_dir: str):
        self.args = args
        self.sf_args = [f"--env=doom_{args.scenario}", "--device=cpu", f"--seed={args.seed}",
                        f"--experiment={EXPERIMENT}", f"--train_dir={train_dir}"]
        self.reward_scaling, self.config = sf_config(args.sf_python, self.sf_args)
        self.summary_dir = os.path.join(train_dir, EXPERIMENT, ".summary", "0")
        self.log_path = os.path.join(train_dir, "stdout.txt")
        self.fps_readings: list[float] = []
        self.env_frames = 0
        self.stopped_at: float | None = None  # seconds from launch to the stop
        self.summary_reader = None  # tensorboard's EventAccumulator, once SF has made the dir
        self.summaries_written = 0
        self.tail: list[str] = []  # SF's last lines, shown if it fails
        self.out = open(args.out, "w")  # noqa: SIM115 (closed in finish)
        log = open(self.log_path, "w")  # noqa: SIM115 (closed by the reader)
        entry = ["-c", SAMPLER_ENTRY] if args.sampler_only else ["-m", "sf_examples.vizdoom.train_vizdoom"]
        self.launched_wall = time.time()
        self.launched = time.monotonic()
        # its own session: a Ctrl-C here reaches this script only, which then stops SF in order
        self.process = subprocess.Popen([args.sf_python, *entry, *self.sf_args], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.descendants = DescendantTracker(self.process.pid)
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        threading.Thread(target=self._read, args=(log,), daemon=True).start()

    def _read(self, log) -> None:
        """Drains SF's output (a full pipe would stall it) into the log and the queue of lines to parse."""
        with log:
            for line in self.process.stdout:
                log.write(line)
                self.tail = [*self.tail[-(TAIL_LINES - 1):], line]
                self.lines.put((time.monotonic() - self.launched, ANSI.sub("", line)))

    def record(self, **fields) -> None:
        record = {"trainer": "sample_factory", "scenario": self.args.scenario, "seed": self.args.seed, **fields}
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()
        print(json.dumps(record), flush=True)

    def _on_line(self, t: float, line: str) -> None:
        if self.args.sampler_only:
            match = SAMPLER_FPS.search(line)
            if match:  # SF counts agent steps here; env frames are those times the frameskip
                self.env_frames = int(match.group(1)) * self.config["env_frameskip"]
                self.fps_readings.append(float(match.group(2)))
                self.record(time_s=round(t, 2), env_frames=self.env_frames, fps=self.fps_readings[-1],
                            mean_return=None, mean_episode_frames=None)
            return
        match = TRAIN_FPS.search(line)
        if match:
            self.env_frames = int(match.group(2))
            if match.group(1) != "nan":
                self.fps_readings.append(float(match.group(1)))

    def _emit_summaries(self) -> None:
        if self.args.sampler_only or not os.path.isdir(self.summary_dir):
            return
        if self.summary_reader is None:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            self.summary_reader = EventAccumulator(self.summary_dir, size_guidance={"scalars": 0})  # 0: keep all
        for summary in summaries(self.summary_reader, self.summaries_written):
            self.summaries_written += 1
            time_s = summary.wall_time - self.launched_wall
            if self.stopped_at is not None and time_s > self.stopped_at:
                continue  # written during SF's shutdown, past the budget
            self.record(time_s=round(time_s, 2), env_frames=summary.env_frames,
                        fps=None if math.isnan(summary.fps) else round(summary.fps, 1),
                        mean_return=round(summary.true_objective / self.reward_scaling, 3),
                        mean_episode_frames=None if math.isnan(summary.episode_frames) else round(
                            summary.episode_frames, 1))

    def watch(self) -> None:
        """Readings until the time budget is spent or SF exits."""
        next_summary_poll = 0.0
        while time.monotonic() - self.launched < self.args.seconds and self.process.poll() is None:
            time.sleep(TICK_S)
            self.descendants.poll()
            self._drain()
            if time.monotonic() >= next_summary_poll:
                self._emit_summaries()
                next_summary_poll = time.monotonic() + SUMMARY_POLL_S

    def _drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self._on_line(*self.lines.get_nowait())

    def stop(self) -> StopReport:
        """Stop SF and everything it left."""
        self.stopped_at = time.monotonic() - self.launched
        self.descendants.poll()
        exited_after: float | None = 0.0
        if self.process.poll() is None:
            asked = time.monotonic()
            self.process.send_signal(STOP_SIGNALS[self.args.stop_signal])
            try:
                self.process.wait(GRACE_S)
                exited_after = time.monotonic() - asked
            except subprocess.TimeoutExpired:
                exited_after = None
        # what is still finishing once SF's main process is gone gets SETTLE_S to exit by itself
        psutil.wait_procs(self.descendants.alive(self.descendants.engines) +
                          self.descendants.alive(self.descendants.workers), timeout=SETTLE_S)
        left_engines = self.descendants.alive(self.descendants.engines)
        left_workers = self.descendants.alive(self.descendants.workers)
        # multiprocessing's resource tracker unlinks SF's named semaphores once every other SF process is gone
        trackers = [worker for worker in left_workers if is_resource_tracker(worker)]
        kill([process for process in left_engines + left_workers if process not in trackers])
        psutil.wait_procs(trackers, timeout=TRACKER_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever else is still in SF's group
        kill(trackers)
        self.process.wait()
        engine_entries = sum(remove_engine_shm(game_id) for game_id in self.descendants.instance_ids)
        tensor_files = remove_torch_shm([self.process.pid, *self.descendants.workers])
        return StopReport(len(left_engines), len(left_workers), engine_entries, tensor_files, exited_after)

    def finish(self, stop: StopReport) -> None:
        self._drain()
        self._emit_summaries()  # the last ones, flushed by SF's shutdown
        self.record(final=True, sampler_only=self.args.sampler_only, time_s=round(self.stopped_at, 2),
                    env_frames=self.env_frames,
                    median_fps=round(statistics.median(self.fps_readings), 1) if self.fps_readings else None,
                    fps_readings=len(self.fps_readings), sf_exit_code=self.process.returncode,
                    stop_signal=self.args.stop_signal,
                    sf_exit_after_stop_s=None if stop.exited_after is None else round(stop.exited_after, 2),
                    engines_seen=len(self.descendants.engines), left_engines=stop.engines,
                    left_sf_processes=stop.sf_processes, left_shm_entries=stop.shm_entries,
                    left_tensor_files=stop.tensor_files,
                    sf_config={key: self.config.get(key) for key in REPORTED_CONFIG})
        self.out.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="basic")
    parser.add_argument("--seconds", type=float, default=300.0, help="wall-time budget from launch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sf_python", default="/work/sfvenv/bin/python", help="python of SF's venv")
    parser.add_argument("--out", required=True, help="JSON lines file to write")
    parser.add_argument("--sampler_only", action="store_true", help="SF's sampling API: no learner")
    parser.add_argument("--train_dir", default=None, help="kept if given (SF's output in stdout.txt); a temporary "
                        "dir removed otherwise")
    parser.add_argument("--stop_signal", choices=sorted(STOP_SIGNALS), default="INT",
                        help="sent to SF's main process at the budget: INT is its Ctrl-C path, TERM the issue's stop")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # so the clean-up below runs, even where SIGINT came in ignored (a background job of a script)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    train_dir = args.train_dir or tempfile.mkdtemp(prefix="sf_doom_")
    os.makedirs(train_dir, exist_ok=True)
    run = SampleFactoryRun(args, train_dir)
    interrupted = False
    try:
        run.watch()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the clean-up short
            signal.signal(signum, signal.SIG_IGN)
        stop = run.stop()
        run.finish(stop)
        print(f"left behind by Sample Factory: {stop.engines} engine processes, {stop.shm_entries} /dev/shm entries "
              f"(removed); {stop.sf_processes} of its own processes (killed), {stop.tensor_files} torch files in "
              "/dev/shm (removed)", flush=True)
        if not args.train_dir:
            shutil.rmtree(train_dir, ignore_errors=True)
    if interrupted:
        return 128 + signal.SIGINT
    if run.stopped_at < args.seconds:  # SF ended before its budget: a failure
        print(f"Sample Factory exited early with code {run.process.returncode}:\n{''.join(run.tail)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
