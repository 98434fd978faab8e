"""The trainer's CUDA path end to end, in one command, for a machine with a GPU (issue 39).

    python scripts/gpu_check.py --out DIR        # without CUDA: one line, exit 0

With CUDA it runs, each under its own time limit and all within --budget_s (500 s; under 8.5 minutes in all):
- cartpole: `python -m appo.train --env=CartPole-v1 --device=cuda` at the defaults to mean reward 475, timed from
  launch to the moment its result.json records (appo.tools.trainer_process.run_trainer), and the same on the CPU;
- breakout_ale (atari_breakout) and breakout_envpool (envpool:Breakout-v5, if envpool imports) on the GPU with
  --num_workers actors for a fixed time: samples/s and env frames/s from benchmark.json, the final mean reward;
- doom_basic on the GPU to mean reward 0, its env steps to get there against tests/test_doom.py's bar (250k; the
  run may go on to twice that, so that a slower run still says how many it took);
- learner_ranks: with two GPUs or more, breakout_ale again with --learner_processes_per_policy at 2 and at every GPU
  (one learner rank per GPU, NCCL), for the learner's samples/s beside one rank's;
- scaling: breakout_ale at 2, 4, 8 and 16 actor workers (those up to the CPUs), SCALING_S each: the trainer's env
  frames/s beside the machine's raw limit for the env (benchmark mode measures it first, every core stepping the env
  with no learning) and the fraction, a table of its own at the end of the report;
- cnn_sgd: the learner's SGD step (appo.learning.ppo.train_step, through scripts/bench_cnn.py) of the Nature CNN on
  the GPU, Breakout- and Doom-sized, float32 and bfloat16 autocast, at 256 and 2048 samples;
- precision: what the trainer chose on the GPU (its `auto:` lines about bfloat16, the learner's device, whether
  --learner_bf16 changes the CNN's outputs on CUDA) and whether the trainer pins host memory;
- sf_cartpole, sf_breakout: Sample Factory 2's own APPO on the same budgets, if `sample_factory` imports (with
  --sf_path prepended to PYTHONPATH), stopped and cleaned up by scripts/sample_factory_doom.py's SampleFactoryRun.
  Breakout runs SF's Atari defaults asynchronously (--async_rl=True): in its sync mode a rollout of all the workers
  must be a whole number of training batches, which --num_workers=12 is not (12 x 128 steps against 4 x 256).
  SF 2.1.1 pins gymnasium < 1 and fails on numpy >= 2.4: it runs here on gymnasium 1.x, with the two Atari wrappers
  1.0 renamed aliased back and ale_py's envs registered in each of its processes (GYMNASIUM_SHIM), on a numpy < 2.4
  from --sf_path.

A failed sub-run is a row with its exit code, and the last lines of its output go to runs.log; the script goes on.
It prints a markdown table (check, env, samples/s, time to score, result) and writes gpu_check.md, gpu_check.json
and runs.log to --out. Trainers run from a scratch folder, so the installed appo is the one imported (from the
repo's root, its source folder appo/ would shadow it without appo.envs and appo.utils). `--device=cpu` runs the
same checks on the CPU with --budget_scale, to try the script itself.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import json
import os
import platform
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SF_ATARI_ENTRY = "--sf-atari-entry"  # argv[1] when this file is Sample Factory's main module (its Atari example)
GYMNASIUM_SHIM = "GPU_CHECK_SF_GYMNASIUM_SHIM"  # set in SF's environment: every SF process applies the shim below


def gymnasium_shim_for_sample_factory() -> None:
    """What SF 2.1.1's Atari example needs from gymnasium 1.x: ale_py's envs registered (gymnasium 1.0 stopped
    loading plugins) and the wrappers 1.0 renamed under their old names. Runs in SF's main process and, as this file
    is its main module, again in each process SF spawns."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    if not hasattr(gym.wrappers, "GrayScaleObservation"):
        gym.wrappers.GrayScaleObservation = gym.wrappers.GrayscaleObservation
    if not hasattr(gym.wrappers, "FrameStack"):
        gym.wrappers.FrameStack = gym.wrappers.FrameStackObservation


if os.environ.get(GYMNASIUM_SHIM) == "1":
    gymnasium_shim_for_sample_factory()

# Budgets (seconds) at --budget_scale=1. A trainer's is its --train_for_seconds; TRAINER_GRACE_S more for start-up
# and shutdown, then the watchdog stops it.
CARTPOLE_S = 60.0
CARTPOLE_CPU_S = 40.0
BREAKOUT_S = 60.0
SCALING_WORKERS = (2, 4, 8, 16)
SCALING_S = 30.0
DOOM_S = 120.0
DOOM_TARGET = 0.0
DOOM_ENV_STEPS = 250_000  # tests/test_doom.py's bar for mean reward DOOM_TARGET
DOOM_STEPS_ALLOWED = 2 * DOOM_ENV_STEPS  # the run's budget: past the bar, it still says when it got there
CARTPOLE_TARGET = 475.0
SF_S = 60.0
SF_STOP_S = 40.0  # SampleFactoryRun.stop: SF's own shutdown (up to GRACE_S) and the clean-up after it
TRAINER_GRACE_S = 25.0
KILL_GRACE_S = 15.0  # after SIGTERM, before SIGKILL
MIN_TRAIN_S = 15.0  # a sub-run the budget leaves less than this for is skipped
CNN_MIN_SECONDS = 1.0
CNN_SAMPLES = (256, 2048)
BIG = 10**12  # benchmark budgets that never stop a run first
TAIL_LINES = 60  # of each sub-run's output, in runs.log (all of a failed one's, up to FAILED_TAIL_LINES)
FAILED_TAIL_LINES = 400
GPU_POLL_S = 1.0

SF_REWARD = re.compile(r"Avg episode reward: \[\(0, '(-?[0-9.]+)'\)\]")
SF_THROUGHPUT = re.compile(r"Throughput: 0: ([0-9]+(?:\.[0-9]+)?)")
# Sample Factory's own CartPole command line (sf_examples/train_gym_env.py's docstring), without its checkpointing
SF_CARTPOLE_FLAGS = ["--algo=APPO", "--use_rnn=False", "--num_envs_per_worker=20", "--policy_workers_per_policy=2",
                     "--recurrence=1", "--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1",
                     "--experiment_summaries_interval=10"]
# SF's Atari example at its defaults (sf_examples/atari/atari_params.py), asynchronous (see the module docstring)
SF_BREAKOUT_FLAGS = ["--async_rl=True"]


@dataclass
class Row:
    check: str
    env: str
    samples_per_s: float | None = None
    time_to_score_s: float | None = None
    result: str = ""
    ok: bool = True
    returncode: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def skipped(self) -> bool:
        return self.result.startswith("skipped")

    def cells(self) -> list[str]:
        rate = "-" if self.samples_per_s is None else f"{self.samples_per_s:,.0f}"
        solved = "-" if self.time_to_score_s is None else f"{self.time_to_score_s:.1f} s"
        result = self.result if self.ok else f"**FAILED** {self.result}"
        return [self.check, self.env, rate, solved, result.replace("|", "/")]


class Budget:
    """The script's wall-time budget: each sub-run gets what it asks for, or what is left."""

    def __init__(self, seconds: float, scale: float):
        self.deadline = time.monotonic() + seconds
        self.scale = scale

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def train_seconds(self, wanted: float, overhead: float) -> float | None:
        """Seconds of training for a sub-run that wants `wanted` (before scaling) and needs `overhead` more; None
        when the budget no longer has MIN_TRAIN_S of it."""
        seconds = min(wanted * self.scale, self.left() - overhead)
        return seconds if seconds >= min(MIN_TRAIN_S, wanted * self.scale) else None


class Watchdog:
    """Stops this script's child processes (a trainer and all it started) once `seconds` have passed: SIGTERM to
    the children, SIGKILL to what is left of the tree after KILL_GRACE_S. It also notes the children's pids (for
    their /dev/shm entries) and samples the GPU's use with nvidia-smi, when there is one."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.fired = False
        self.pids: set[int] = set()
        self.gpu_util: list[float] = []
        self.gpu_mem_mb: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Watchdog:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        remove_shm_of(self.pids)

    def _watch(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._done.wait(GPU_POLL_S):
            with contextlib.suppress(psutil.Error):
                self.pids.update(child.pid for child in me.children())
            self._sample_gpu()
            if time.monotonic() - self._started < self.seconds:
                continue
            self.fired = True
            with contextlib.suppress(psutil.Error):
                tree = me.children(recursive=True)
                children = me.children()
                for child in children:
                    with contextlib.suppress(psutil.Error):
                        child.terminate()
                psutil.wait_procs(children, timeout=KILL_GRACE_S)
                for process in tree + me.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        process.kill()
            return

    def _sample_gpu(self) -> None:
        if shutil.which("nvidia-smi") is None:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,"
                                  "nounits", "--id=0"], capture_output=True, text=True, timeout=5).stdout
            util, mem = (float(x) for x in out.strip().split(","))
            self.gpu_util.append(util)
            self.gpu_mem_mb.append(mem)

    def gpu_note(self) -> str:
        if not self.gpu_util:
            return ""
        return f"; GPU busy {statistics.mean(self.gpu_util):.0f}% (mean), {max(self.gpu_mem_mb):,.0f} MiB (peak)"


def remove_shm_of(pids: set[int]) -> None:
    """The /dev/shm weight segments of these trainer pids, if they are gone (a trainer killed with -9 leaves them)."""
    import psutil

    for pid in pids:
        if psutil.pid_exists(pid):
            continue
        for path in glob.glob(f"/dev/shm/appo_{pid}_*"):
            with contextlib.suppress(OSError):
                os.unlink(path)


class Log:
    """runs.log in --out: the end of each sub-run's output."""

    def __init__(self, path: Path):
        self.path = path
        path.write_text("")

    def add(self, name: str, output: str, failed: bool) -> None:
        lines = output.splitlines()
        keep = lines[-(FAILED_TAIL_LINES if failed else TAIL_LINES):]
        with self.path.open("a") as f:
            f.write(f"===== {name}: {'FAILED, ' if failed else ''}last {len(keep)} of {len(lines)} lines\n")
            f.write("\n".join(keep) + "\n\n")


@dataclass
class Context:
    args: argparse.Namespace
    budget: Budget
    log: Log
    scratch: Path  # train dirs; also the trainers' working directory
    trainer_outputs: dict[str, str] = field(default_factory=dict)
    benchmarks: dict[str, dict] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ trainer runs
def trainer_run(ctx: Context, name: str, env: str, flags: list[str], wanted_s: float,
                target: float | None = None, steps_bar: int | None = None) -> Row:
    """One `python -m appo.train` (appo.tools.trainer_process.run_trainer) in benchmark mode, its
    --train_for_seconds from the budget, stopped by a watchdog if it overruns: samples/s from its benchmark.json,
    the time and env steps to `target` from its result.json (a failure past `steps_bar` env steps)."""
    from appo.tools.trainer_process import run_trainer

    seconds = ctx.budget.train_seconds(wanted_s, TRAINER_GRACE_S)
    if seconds is None:
        return Row(name, env, result=f"skipped: --budget_s spent ({ctx.budget.left():.0f} s left)", ok=False)
    train_dir = ctx.scratch / name
    args = [f"--env={env}", f"--train_dir={train_dir}", f"--experiment={name}", f"--train_for_seconds={seconds:.0f}",
            "--benchmark=True", f"--benchmark_env_steps={BIG}", f"--benchmark_samples={BIG}", *flags]
    if target is not None:
        args.append(f"--target_reward={target:g}")
    print(f"[{name}] python -m appo.train {' '.join(args)}", flush=True)
    with Watchdog(seconds + TRAINER_GRACE_S) as dog:
        run = run_trainer(args)
    ctx.trainer_outputs[name] = run.output
    failed = run.returncode != 0 or dog.fired
    ctx.log.add(name, run.output, failed)
    bench_path = train_dir / name / "benchmark.json"
    bench = json.loads(bench_path.read_text()) if bench_path.exists() else {}
    ctx.benchmarks[name] = bench
    final = run.result  # None: the run wrote no result.json (killed by the watchdog, or it crashed)
    trained = bench.get("samples_per_s", 0) > 0
    solved = run.solved_s is not None and (steps_bar is None or run.solved_env_steps <= steps_bar)
    parts = []
    if target is not None and run.solved_s is not None:
        parts.append(f"mean reward {target:g} reached at {run.solved_env_steps:,} env steps"
                     + ("" if steps_bar is None else f" ({'within' if solved else 'NOT within'} the bar of "
                                                     f"{steps_bar:,})"))
    elif target is not None:
        parts.append(f"mean reward {target:g} NOT reached (stopped: {final.reason if final else 'no result.json'})")
    if not trained:
        parts.append("no sample trained (benchmark.json: samples/s 0)")
    if final and final.final_reward() is not None:
        parts.append(f"final reward {final.final_reward():.1f}")
    if final:
        parts.append(f"{final.env_steps:,} env steps in {final.seconds:.0f} s")
    if bench:
        parts.append(f"{bench['env_frames_per_s']:,.0f} env frames/s, {bench['num_workers']} workers x "
                     f"{bench['num_envs_per_worker']} envs, device {bench['device']}, policy lag "
                     f"{bench['policy_lag']['avg']:.1f}, {bench['inference_batch_size']:.0f} obs per forward pass; "
                     f"bottleneck: {bench['bottleneck']}")
    if "raw_limit" in bench:
        parts.append(f"{bench['fraction_of_raw_limit']:.0%} of the raw limit, "
                     f"{bench['raw_limit']['env_frames_per_s']:,.0f} env frames/s")
    if dog.fired:
        parts.append(f"stopped by the watchdog after {seconds + TRAINER_GRACE_S:.0f} s")
    if run.returncode != 0:
        parts.append(f"exit code {run.returncode}, its output's end in runs.log: "
                     + " / ".join(line.strip() for line in run.output.strip().splitlines()[-2:]))
    ok = not failed and (target is None or solved) and trained
    row = Row(name, env, bench.get("samples_per_s"), run.solved_s, "; ".join(parts) + dog.gpu_note(), ok,
              run.returncode, {"flags": args, "benchmark": bench, "env_steps_to_target": run.solved_env_steps,
                               "watchdog_fired": dog.fired, "gpu_util_mean": statistics.mean(dog.gpu_util)
                               if dog.gpu_util else None, "gpu_mem_peak_mb": max(dog.gpu_mem_mb, default=None)})
    print(f"[{name}] {'ok' if ok else 'FAILED'}: {row.result}", flush=True)
    return row


def envpool_import_error() -> str | None:
    """None if envpool imports here, else why not: its last line of error (a module it needs, its Atari ROMs)."""
    try:
        done = subprocess.run([sys.executable, "-c", "import envpool"], capture_output=True, text=True, timeout=120)
    except (subprocess.SubprocessError, OSError) as error:
        return str(error)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]


# ------------------------------------------------------------------------------------------------ the CNN's SGD
def to_device(value: Any, device: Any) -> Any:
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value.to(device)


def cnn_sgd(ctx: Context, device_name: str) -> list[Row]:
    """SGD samples/s of the Nature CNN (bench_cnn's model, minibatch and Candidate; appo.learning.ppo.train_step) on
    the device, float32 and under bfloat16 autocast; and whether --learner_bf16 changes the model's outputs there."""
    import bench_cnn
    import torch

    device = torch.device(device_name)
    min_seconds = CNN_MIN_SECONDS * min(1.0, ctx.budget.scale)
    sizes = CNN_SAMPLES if ctx.budget.scale >= 1 else CNN_SAMPLES[:1]
    cfg = bench_cnn.make_config(env="unused")
    hp = bench_cnn.Hyperparams.from_cfg(cfg)
    rows = []
    for shape in ("breakout", "doom"):
        obs_space, action_space = bench_cnn.SHAPES[shape]
        torch.manual_seed(0)
        base = bench_cnn.ActorCritic(obs_space, action_space, cfg)
        batches = {n: bench_cnn.minibatch(base, obs_space, n, cfg) for n in sizes}  # on the CPU, then moved
        base.to(device)
        if ctx.budget.left() < 20:
            rows.append(Row("cnn_sgd", shape, result="skipped: --budget_s spent", ok=False))
            continue
        for n, (mb, advantages, targets) in batches.items():
            mb, advantages, targets = (to_device(x, device) for x in (mb, advantages, targets))
            for precision in ("float32", "bf16"):
                name = f"cnn_sgd {precision}"
                try:
                    candidate = bench_cnn.Candidate(bench_cnn.REFERENCE, base, cfg)
                    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16"
                                else contextlib.nullcontext())

                    def step(candidate=candidate, autocast=autocast, mb=mb, advantages=advantages,
                             targets=targets) -> bool:
                        with autocast:  # whether the update was applied: a host sync, so each step is timed whole
                            return bool(bench_cnn.train_step(candidate.model, candidate.optimizer, cfg, hp, mb,
                                                             advantages, targets)[-1])

                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    first = bench_cnn.timed(step)  # cuDNN picks its algorithms here
                    finite = step()
                    seconds = bench_cnn.seconds_per_call(step, min_seconds)
                    memory = (f", {torch.cuda.max_memory_allocated(device) / 2**20:,.0f} MiB peak"
                              if device.type == "cuda" else "")
                    rows.append(Row(name, f"{shape}, {n} samples", n / seconds, None,
                                    f"{seconds * 1e3:.1f} ms a step, first step {first:.2f} s{memory}"
                                    + ("" if finite else "; loss or gradient NOT finite"), finite,
                                    details={"samples": n, "seconds_per_step": seconds, "first_step_s": first}))
                except Exception as error:  # a failure on this device is the finding: reported, the rest goes on
                    rows.append(Row(name, f"{shape}, {n} samples", result=f"{type(error).__name__}: {error}",
                                    ok=False))
                    ctx.log.add(f"{name} {shape} {n}", repr(error), True)
                print(f"[cnn_sgd] {rows[-1].env} {precision}: {rows[-1].cells()[2]} samples/s {rows[-1].result}",
                      flush=True)
        rows.append(bf16_flag_effect(base, obs_space, shape, device))
    return rows


def bf16_flag_effect(model: Any, obs_space: Any, shape: str, device: Any) -> Row:
    """Whether --learner_bf16/--inference_bf16 (ActorCritic.set_bf16_images) change the model's outputs on this
    device: the same batch with the flag off and on."""
    import bench_cnn
    import torch

    try:
        obs = to_device(bench_cnn.observations(obs_space, (64,), torch.Generator().manual_seed(2)), device)
        states = torch.zeros(64, model.state_size, device=device)
        outputs = []
        for enabled in (False, True):
            model.set_bf16_images(enabled)
            with torch.no_grad():
                outputs.append(model.forward_step(obs, states)[0].float())
        model.set_bf16_images(False)
        error = bench_cnn.relative_error(outputs[1], outputs[0])
        return Row("precision", f"{shape}: set_bf16_images on {device.type}", None, None,
                   f"outputs with the bf16 flag on differ from float32 by {error:.1e} (relative): "
                   + ("the flag computes in bfloat16 here" if error > 0 else "the flag changes nothing here"),
                   details={"relative_error": error})
    except Exception as error:
        return Row("precision", f"{shape}: set_bf16_images", result=f"{type(error).__name__}: {error}", ok=False)


def precision_rows(ctx: Context) -> list[Row]:
    """What the trainer chose: its auto: lines about bfloat16 and the learner's device, per image run; and whether
    any of appo's code pins host memory."""
    from appo.config.auto import cpu_has_bf16

    rows = []
    for name, output in ctx.trainer_outputs.items():
        bench = ctx.benchmarks.get(name, {})
        if name.startswith("cartpole"):
            continue
        auto = [line.split("auto:", 1)[1].strip() for line in output.splitlines()
                if "auto:" in line and "bf16" in line]
        rows.append(Row("precision", name, None, None,
                        f"auto: {' / '.join(auto) if auto else 'no bf16 choice'}; learner device "
                        f"{bench.get('device', '?')}; this CPU has native bfloat16: {cpu_has_bf16()}",
                        details={"auto_lines": [line for line in output.splitlines() if "auto:" in line]}))
    import appo

    root = Path(appo.__file__).parent
    pins = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                  if "pin_memory" in path.read_text(errors="replace"))
    rows.append(Row("pinned memory", "appo's code", None, None,
                    f"pin_memory in {', '.join(pins)}" if pins else "no pin_memory anywhere in appo: host tensors are "
                    "pageable, copies to the GPU are synchronous", details={"files": pins}))
    return rows


# ------------------------------------------------------------------------------------------------ Sample Factory
def sf_environment(sf_path: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", GYMNASIUM_SHIM: "1"}
    if sf_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (sf_path, os.environ.get("PYTHONPATH")) if p)
    return env


def sample_factory_version(sf_path: str | None) -> str | None:
    """SF's version if it imports (with --sf_path), else None."""
    code = "import sample_factory, sf_examples, importlib.metadata as m; print(m.version('sample-factory'))"
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in sf_environment(sf_path).items() if k != GYMNASIUM_SHIM})
        if done.returncode == 0:
            return done.stdout.strip().splitlines()[-1]
    return None


def sf_run(ctx: Context, name: str, env_name: str, entry: list[str], sf_args: list[str], frameskip: int,
           target: float | None) -> Row:
    """SF for a time budget, stopped and cleaned up as scripts/sample_factory_doom.py does: its FPS and samples/s
    (medians of its printed readings), its last mean reward, the time to `target`."""
    from sample_factory_doom import EXPERIMENT, DescendantTracker, SampleFactoryRun

    seconds = ctx.budget.train_seconds(SF_S, SF_STOP_S)
    if seconds is None:
        return Row(name, env_name, result=f"skipped: --budget_s spent ({ctx.budget.left():.0f} s left)", ok=False)
    train_dir = ctx.scratch / name
    train_dir.mkdir(parents=True, exist_ok=True)
    sf_args = [*sf_args, f"--experiment={EXPERIMENT}", f"--train_dir={train_dir}", "--seed=0",
               "--save_every_sec=100000"]

    class Run(SampleFactoryRun):
        """SampleFactoryRun for another of SF's entry points: its own launch, the parent's readings and stop."""

        def __init__(self) -> None:  # SampleFactoryRun.__init__'s state, without its Doom config query
            self.args = argparse.Namespace(scenario=env_name, seed=0, seconds=seconds, sampler_only=False,
                                           stop_signal="INT", out=str(train_dir / "records.jsonl"))
            self.sf_args, self.reward_scaling, self.config = sf_args, 1.0, {"env_frameskip": frameskip}
            self.summary_dir = str(train_dir / EXPERIMENT / ".summary" / "0")
            self.log_path = str(train_dir / "stdout.txt")
            self.fps_readings, self.env_frames, self.stopped_at = [], 0, None
            self.summary_reader, self.summaries_written, self.tail = None, 0, []
            self.rewards: list[tuple[float, float]] = []
            self.throughput: list[float] = []
            self.out = open(self.args.out, "w")  # noqa: SIM115 (closed in finish)
            log = open(self.log_path, "w")  # noqa: SIM115 (closed by the reader)
            self.launched_wall, self.launched = time.time(), time.monotonic()
            self.process = subprocess.Popen([sys.executable, *entry, *sf_args], stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                            env=sf_environment(ctx.args.sf_path), cwd=str(ctx.scratch))
            self.descendants = DescendantTracker(self.process.pid)
            self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
            threading.Thread(target=self._read, args=(log,), daemon=True).start()

        def _on_line(self, t: float, line: str) -> None:
            super()._on_line(t, line)
            if match := SF_REWARD.search(line):
                self.rewards.append((t, float(match.group(1))))
            if (match := SF_THROUGHPUT.search(line)) and float(match.group(1)) > 0:
                self.throughput.append(float(match.group(1)))

        def record(self, **fields: Any) -> None:  # to its records file only
            self.out.write(json.dumps({"trainer": "sample_factory", "env": env_name, **fields}) + "\n")
            self.out.flush()

    print(f"[{name}] python {' '.join(entry)} {' '.join(sf_args)} ({seconds:.0f} s)", flush=True)
    run = Run()
    with Watchdog(seconds + SF_STOP_S + 30):  # samples the GPU; a backstop only: SampleFactoryRun stops SF
        try:
            run.watch()
        finally:
            stop = run.stop()
            run.finish(stop)
    output = Path(run.log_path).read_text(errors="replace")
    ended_early = run.stopped_at is not None and run.stopped_at < seconds
    ctx.log.add(name, output, ended_early)
    solved = next((t for t, reward in run.rewards if target is not None and reward >= target), None)
    samples = statistics.median(run.throughput) if run.throughput else None
    parts = []
    if target is not None:
        parts.append(f"mean reward {target:g} reached" if solved is not None
                     else f"mean reward {target:g} NOT reached in {seconds:.0f} s")
    if run.rewards:
        parts.append(f"SF's last avg episode reward {run.rewards[-1][1]:.1f}")
    readings = [fps for fps in run.fps_readings if fps > 0]
    if readings:
        parts.append(f"{statistics.median(readings):,.0f} env frames/s (median of SF's non-zero 10-s readings, "
                     f"{readings[-1]:,.0f} the last), {run.env_frames:,} frames")
    parts.append(f"left behind: {stop.engines + stop.sf_processes} processes, {stop.tensor_files} /dev/shm files "
                 "(removed)")
    if ended_early:
        parts.append(f"SF exited after {run.stopped_at:.0f} s with code {run.process.returncode} (runs.log)")
    row = Row(name, env_name, samples, solved, "; ".join(parts), not ended_early and samples is not None,
              run.process.returncode, {"sf_args": sf_args, "rewards": run.rewards[-5:],
                                       "fps_readings": run.fps_readings})
    print(f"[{name}] {'ok' if row.ok else 'FAILED'}: {row.result}", flush=True)
    return row


def sf_atari_main(argv: list[str]) -> int:
    """This file as SF's main module: its Atari example under the gymnasium shim (applied at import, see above)."""
    from sf_examples.atari.train_atari import main as train_atari

    sys.argv = [sys.argv[0], *argv]
    return train_atari()


# ------------------------------------------------------------------------------------------------ the report
def machine(args: argparse.Namespace) -> dict[str, Any]:
    import importlib.metadata

    import torch

    info: dict[str, Any] = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                            "python": platform.python_version(), "executable": sys.executable,
                            "cpus": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
                            "device": args.device}
    with contextlib.suppress(OSError):
        model = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        info["cpu"] = model.group(1) if model else platform.processor()
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    gpus=torch.cuda.device_count(), cudnn=torch.backends.cudnn.version(),
                    cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
                    matmul_precision=torch.get_float32_matmul_precision())
    with contextlib.suppress(OSError):
        info["dev_shm_gib"] = round(shutil.disk_usage("/dev/shm").total / 2**30, 1)
    for package in ("numpy", "gymnasium", "ale-py", "vizdoom", "envpool", "faster-fifo", "opencv-python-headless"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info[package] = importlib.metadata.version(package)
    info["appo"] = appo_install()
    return info


def appo_install() -> str:
    """Where appo is imported from, and whether it holds this tree's code (a wheel built before an edit does not)."""
    import appo

    installed = Path(appo.__file__).resolve().parent
    if installed == REPO / "appo":
        return f"{installed} (the tree itself)"
    stale = []
    for folder, target in (("appo", installed), ("envs", installed / "envs"), ("utils", installed / "utils")):
        for source in (REPO / folder).rglob("*.py"):
            relative = source.relative_to(REPO / folder)
            if folder == "appo" and relative.parts[0] in ("envs", "utils"):
                continue
            copy = target / relative
            if not copy.exists() or copy.read_bytes() != source.read_bytes():
                stale.append(f"{folder}/{relative}")
    if stale:
        return f"{installed}: STALE, differs from this tree in {len(stale)} files ({', '.join(stale[:5])})"
    return f"{installed} (matches this tree)"


def write_report(out: Path, info: dict[str, Any], rows: list[Row], started: float) -> str:
    header = ["check", "env", "samples/s", "time to score", "result"]
    lines = [f"# gpu_check, {info['date']}", "",
             f"{info.get('gpu', 'no GPU')} ({info.get('gpu_memory_gib', '-')} GiB), {info['cpus']} CPUs "
             f"({info.get('cpu', '?')}), /dev/shm {info.get('dev_shm_gib', '?')} GiB; Python {info['python']}, torch "
             f"{info['torch']} (CUDA {info['cuda']}, cuDNN {info.get('cudnn', '-')}, cudnn.allow_tf32 "
             f"{info.get('cudnn_allow_tf32', '-')}, float32 matmul precision {info.get('matmul_precision', '-')}); "
             + ", ".join(f"{p} {info[p]}" for p in ("numpy", "gymnasium", "ale-py", "vizdoom", "envpool") if p in info)
             + f"; appo from {info['appo']}; whole script {time.monotonic() - started:.0f} s.", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    lines += scaling_table(rows)
    text = "\n".join(lines) + "\n"
    (out / "gpu_check.md").write_text(text)
    (out / "gpu_check.json").write_text(json.dumps({"machine": info, "rows": [asdict(row) for row in rows]},
                                                   indent=1, default=str))
    return text


# ------------------------------------------------------------------------------------------------ main
CHECKS = ("cartpole", "breakout_ale", "doom_basic", "cnn_sgd", "learner_ranks", "scaling", "cartpole_cpu",
          "breakout_envpool", "sf_cartpole", "sf_breakout")


def run_checks(ctx: Context) -> Iterator[Row]:
    args, device = ctx.args, ctx.args.device
    workers = f"--num_workers={args.num_workers}"
    chosen = set(args.only.split(",")) if args.only else set(CHECKS)
    doom_steps = f"--train_for_env_steps={int(DOOM_STEPS_ALLOWED * args.budget_scale)}"
    doom_bar = int(DOOM_ENV_STEPS * args.budget_scale)
    trainers = {  # name: (env, flags, seconds wanted, target, env steps bar)
        "cartpole": ("CartPole-v1", [f"--device={device}"], CARTPOLE_S, CARTPOLE_TARGET, None),
        "breakout_ale": ("atari_breakout", [f"--device={device}", workers], BREAKOUT_S, None, None),
        "doom_basic": ("doom_basic", [f"--device={device}", workers, doom_steps], DOOM_S, DOOM_TARGET, doom_bar),
        "cartpole_cpu": ("CartPole-v1", ["--device=cpu"], CARTPOLE_CPU_S, CARTPOLE_TARGET, None),
        "breakout_envpool": ("envpool:Breakout-v5", [f"--device={device}", workers], BREAKOUT_S, None, None),
    }
    for name in CHECKS:  # in this order: the GPU's trainer runs first, Sample Factory last
        if name not in chosen:
            continue
        if name == "cnn_sgd":
            yield from guarded(ctx, name, "Nature CNN", lambda: cnn_sgd(ctx, device))
        elif name == "learner_ranks":
            yield from learner_ranks(ctx, workers)
        elif name == "scaling":
            yield from scaling(ctx)
        elif name == "breakout_envpool" and (error := envpool_import_error()) is not None:
            yield Row(name, "envpool:Breakout-v5", result=f"skipped: envpool does not import ({error})")
        elif name in trainers:
            env, flags, seconds, target, bar = trainers[name]
            yield from guarded(ctx, name, env, lambda name=name, env=env, flags=flags, seconds=seconds,
                               target=target, bar=bar: [trainer_run(ctx, name, env, flags, seconds, target, bar)])
    if chosen & {"sf_cartpole", "sf_breakout"}:
        yield from sample_factory_runs(ctx, chosen)
    yield from guarded(ctx, "precision", "-", lambda: precision_rows(ctx))


def learner_ranks(ctx: Context, workers: str) -> Iterator[Row]:
    """Breakout with --learner_processes_per_policy at 2 and at every GPU (or 2 ranks on the CPU with --device=cpu),
    beside breakout_ale's one learner: needs 2 GPUs or more."""
    import torch

    device = ctx.args.device
    gpus = torch.cuda.device_count() if device == "cuda" else 2
    if gpus < 2:
        yield Row("learner_ranks", "atari_breakout", result=f"skipped: {gpus} GPU (one learner rank per GPU: needs 2)")
        return
    for ranks in sorted({2, gpus}):
        name = f"breakout_ranks{ranks}"
        flags = [f"--device={device}", workers, f"--learner_processes_per_policy={ranks}"]
        yield from guarded(ctx, name, "atari_breakout", lambda name=name, flags=flags: [
            trainer_run(ctx, name, "atari_breakout", flags, BREAKOUT_S)])


def scaling(ctx: Context) -> Iterator[Row]:
    """breakout_ale at each of SCALING_WORKERS actor workers up to the CPUs, SCALING_S each, every run beside the raw
    limit its benchmark mode measures."""
    cpus = os.cpu_count() or 1
    for workers in [n for n in SCALING_WORKERS if n <= cpus] or [1]:
        name = f"scaling_w{workers}"
        flags = [f"--device={ctx.args.device}", f"--num_workers={workers}"]
        yield from guarded(ctx, name, "atari_breakout", lambda name=name, flags=flags: [
            trainer_run(ctx, name, "atari_breakout", flags, SCALING_S)])


def scaling_table(rows: list[Row]) -> list[str]:
    """The scaling check's rows as one table: frames/s against the raw limit, and where the time went."""
    runs = [row for row in rows if row.check.startswith("scaling_w") and row.details.get("benchmark")]
    if not runs:
        return []
    lines = ["", "Breakout by actor workers (the scaling check): env frames/s against the machine's raw limit.", "",
             "| workers | samples/s | env frames/s | raw limit | fraction | learner busy | GPU busy |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in runs:
        bench = row.details["benchmark"]
        raw = bench.get("raw_limit", {}).get("env_frames_per_s")
        learner = bench["time_shares"]["learner"]
        gpu = row.details.get("gpu_util_mean")
        lines.append(f"| {bench['num_workers']} | {bench['samples_per_s']:,.0f} | {bench['env_frames_per_s']:,.0f} | "
                     + ("- | - |" if raw is None else f"{raw:,.0f} | {bench['fraction_of_raw_limit']:.0%} |")
                     + f" {learner['sgd'] + learner['batching']:.0%} | " + ("-" if gpu is None else f"{gpu:.0f}%")
                     + " |")
    return lines


def sample_factory_runs(ctx: Context, chosen: set[str]) -> Iterator[Row]:
    args, workers = ctx.args, f"--num_workers={ctx.args.num_workers}"
    version = sample_factory_version(args.sf_path)
    if version is None:
        yield Row("sample_factory", "-", result="skipped: sample_factory does not import"
                  + (f" (with {args.sf_path} on PYTHONPATH)" if args.sf_path else ""))
        return
    print(f"[sample_factory] {version}", flush=True)
    sf_device = "gpu" if args.device == "cuda" else "cpu"
    if "sf_cartpole" in chosen:
        yield from guarded(ctx, "sf_cartpole", "CartPole-v1", lambda: [sf_run(
            ctx, "sf_cartpole", "CartPole-v1", ["-m", "sf_examples.train_gym_env"],
            ["--env=CartPole-v1", f"--device={sf_device}", workers, *SF_CARTPOLE_FLAGS], 1, CARTPOLE_TARGET)])
    if "sf_breakout" in chosen:
        yield from guarded(ctx, "sf_breakout", "atari_breakout", lambda: [sf_run(
            ctx, "sf_breakout", "atari_breakout", [str(Path(__file__).resolve()), SF_ATARI_ENTRY],
            ["--env=atari_breakout", f"--device={sf_device}", workers, *SF_BREAKOUT_FLAGS], 4, None)])


def guarded(ctx: Context, name: str, env: str, make_rows: Callable[[], list[Row]]) -> Iterator[Row]:
    """The rows of an in-process check, or one failed row with the error (its traceback in runs.log)."""
    try:
        yield from make_rows()
    except Exception as error:
        import traceback

        ctx.log.add(name, traceback.format_exc(), True)
        yield Row(name, env, result=f"{type(error).__name__}: {error}", ok=False)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder for gpu_check.md, gpu_check.json and runs.log (made if "
                        "missing; a temporary one if not given)")
    parser.add_argument("--budget_s", type=float, default=500.0,
                        help="wall time for all the sub-runs; each is cut to what is left, or skipped")
    parser.add_argument("--num_workers", type=int, default=max(2, min(12, (os.cpu_count() or 4) - 4)),
                        help="actor workers of the Atari and Doom runs (and SF's runs)")
    parser.add_argument("--only", default=None, help=f"comma-separated, of {', '.join(CHECKS)}")
    parser.add_argument("--sf_path", default=None, help="a folder put first on PYTHONPATH for Sample Factory's "
                        "runs (SF and a numpy < 2.4, which SF 2.1.1 needs)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: every check on the CPU, to try this script where there is no GPU")
    parser.add_argument("--budget_scale", type=float, default=1.0, help="scales each sub-run's time budget")
    args = parser.parse_args(argv)
    if args.only and set(args.only.split(",")) - set(CHECKS):
        parser.error(f"--only: of {', '.join(CHECKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SF_ATARI_ENTRY]:
        return sf_atari_main(argv[1:])
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed here, so there is no CUDA to check; nothing run")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device visible to torch {torch.__version__} on this machine; nothing run")
        return 0
    import appo.envs  # noqa: F401  (the installed appo, before bench_cnn and sample_factory_doom put the repo first)

    started = time.monotonic()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    out.mkdir(parents=True, exist_ok=True)
    info = machine(args)
    print(json.dumps(info), flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_runs_") as scratch:
        ctx = Context(args, Budget(args.budget_s, args.budget_scale), Log(out / "runs.log"), Path(scratch))
        cwd = os.getcwd()
        os.chdir(scratch)  # the trainers import the installed appo, not the repo's source folder
        try:
            for row in run_checks(ctx):
                rows.append(row)
                write_report(out, info, rows, started)  # rewritten after each, so a cut-off run still has its rows
        finally:
            os.chdir(cwd)
    print(write_report(out, info, rows, started), flush=True)
    skipped = sum(row.skipped for row in rows)
    failed = sum(not row.ok and not row.skipped for row in rows)
    print(f"gpu_check: of {len(rows)} rows, {failed} failed and {skipped} skipped; written to {out}")
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
