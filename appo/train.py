"""`python -m appo.train --env=CartPole-v1 --experiment=NAME`: train, or resume, an experiment.

Everything that can be wrong with the input (flags, env id, saved cfg.json, the CPU) is checked before
the experiment dir is touched; each problem ends the program with one line and exit code 2. A corrupt
checkpoint is not such a problem: it is moved aside and the newest intact one is used.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from appo.config import auto
from appo.config.cfg import (
    Config,
    ConfigError,
    env_kwargs,
    experiment_dir,
    load_saved_cfg,
    merge_resumed,
    parse_args,
    resolve,
    save_cfg,
)
from appo.envs import EnvError, EnvInfo, env_info
from appo.envs.vector import natively_vectorised, steps_batched, sub_env_step_seconds
from appo.hooks import Hooks
from appo.hooks import registered as registered_hooks
from appo.learning.checkpoint import (
    checkpoint_dir,
    free_path,
    latest_intact_checkpoint,
    list_checkpoints,
    newest_checkpoints,
    parse_name,
)
from appo.memory.buffers import Layout
from appo.population.matchmaking import num_acting_ids
from appo.population.pbt import load_population
from appo.utils.files import atomic_write_text
from appo.utils.logs import log, setup_logging
from appo.utils.process import EXIT_BAD_INPUT
from appo.utils.resources import SHM_DIR, free_bytes, mb, shm_room, write_failure

# Flags that decide when a run stops: raising one on the command line extends a finished run.
BUDGET_FLAGS = ("train_for_env_steps", "train_for_seconds", "target_reward", "target_objective")


def prepare(cfg: Config, given: set[str]) -> tuple[Config, EnvInfo, list[str], list[int]] | None:
    """Validate everything, then (re)create the experiment dir; returns the run's final `Config` (resumed, with
    the env's defaults, resolved). None means: already finished (and no budget flag given that differs from the
    saved one; with one, the finished run is extended)."""
    check_platform()
    exp_dir = experiment_dir(cfg)
    notes: list[str] = []
    extended: dict[str, tuple[Any, Any]] = {}  # budget flag -> (saved value, new value), when extending
    resuming = not cfg.restart and os.path.exists(os.path.join(exp_dir, "cfg.json"))
    if resuming:
        saved = load_saved_cfg(os.path.join(exp_dir, "cfg.json"))
        cfg, notes = merge_resumed(cfg, given, saved)
        if cfg.with_pbt:
            try:
                load_population(exp_dir, cfg.num_policies)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        if os.path.exists(os.path.join(exp_dir, "done")):
            extended = {flag: (saved.get(flag), getattr(cfg, flag)) for flag in BUDGET_FLAGS
                        if flag in given and saved.get(flag) != getattr(cfg, flag)}
            if not extended:
                return None
    # The auto rules size the sampler and learner by what an env step costs; a natively vectorised env's sub-env
    # costs its share of one vectorised step.
    vectorised = steps_batched(cfg.env, cfg.batched_sampling) and natively_vectorised(cfg.env)
    info = env_info(cfg.env, env_kwargs(cfg), measure_step=not resuming and not vectorised)
    if vectorised and not resuming:
        info = dataclasses.replace(info, step_seconds=sub_env_step_seconds(cfg.env, env_kwargs(cfg)))
    # A resumed run keeps the choices saved in its cfg.json; the lines are logged once all else is valid.
    auto_lines: list[str] = []
    if not resuming:
        cfg, auto_lines = auto.apply(cfg, given, info)
    cfg = resolve(cfg, info.num_agents)
    try:
        Layout.from_cfg(cfg, info.obs_space, info.action_space, info.num_agents)
    except TypeError as exc:
        raise ConfigError(f"--env={cfg.env}: {exc}") from exc

    check_train_dir(cfg.train_dir)
    check_device(cfg.device)
    check_room(cfg, info)
    if cfg.backend == "ray":
        check_ray_address(cfg.ray_address)
    for line in auto_lines:
        log.info(line)
    # Everything is valid: only now does the experiment dir change.
    if cfg.restart and os.path.exists(exp_dir):
        aside = free_path(f"{os.path.normpath(exp_dir)}_before_restart_{time.strftime('%Y%m%d-%H%M%S')}")
        os.rename(exp_dir, aside)
        log.info("Restart: moved the old experiment %s aside to %s; starting over", exp_dir, aside)
    # --num_policies cannot change on resume
    initial_env_steps = resume_env_steps(exp_dir, cfg.num_policies) if resuming else [0] * cfg.num_policies
    if extended:
        check_extension(cfg, exp_dir, sum(initial_env_steps))
        os.remove(os.path.join(exp_dir, "done"))
        log.info("Extending the finished experiment %s: %s", exp_dir,
                 ", ".join(f"--{flag}={old} -> {new}" for flag, (old, new) in extended.items()))
    os.makedirs(exp_dir, exist_ok=True)
    save_cfg(cfg, os.path.join(exp_dir, "cfg.json"))
    return cfg, info, notes, initial_env_steps


def check_extension(cfg: Config, exp_dir: str, env_steps: int) -> None:
    """A finished run given a new budget must have steps left to train: a --train_for_env_steps at or below the
    env steps it already has would stop it again at once."""
    if env_steps >= cfg.train_for_env_steps:
        raise ConfigError(f"--train_for_env_steps={cfg.train_for_env_steps}: the finished experiment {exp_dir} "
                          f"already has {env_steps} env steps; to train it further give --train_for_env_steps above "
                          f"{env_steps}")


def resume_env_steps(exp_dir: str, num_policies: int) -> list[int]:
    """Each policy's env steps in its newest intact checkpoint (corrupt newer ones are moved aside); 0 for a
    policy without one, which then starts from scratch."""
    env_steps = [0] * num_policies
    for p in range(num_policies):
        directory = checkpoint_dir(exp_dir, p)
        had_checkpoints = bool(list_checkpoints(directory))
        intact = latest_intact_checkpoint(directory)
        if intact is not None:
            env_steps[p] = parse_name(intact)[1]
        elif had_checkpoints:
            log.warning("Policy %d: every checkpoint in %s is corrupt (all moved aside); it starts from scratch",
                        p, directory)
    return env_steps


def check_platform() -> None:
    """Only x86-64. The shared-memory request/answer counters and the weights seqlock are plain stores read by
    other processes; they rely on x86-64 making stores visible in program order (TSO). A weakly ordered CPU
    (ARM64) may show a counter before the data it publishes (docs/ARCHITECTURE.md, "Memory order")."""
    machine = platform.machine()
    if machine.lower() not in ("x86_64", "amd64"):
        raise ConfigError(f"this CPU ({machine or 'unknown'}) is not x86-64: appo's shared-memory counters rely on "
                          "x86-64 store order, which weakly ordered CPUs such as ARM64 do not give, so it runs only "
                          "on x86-64 for now")


def check_train_dir(train_dir: str) -> None:
    """The experiment folder can be created: --train_dir is a folder, or can be made. Probed by making and
    removing an empty folder in the nearest existing one: permission bits do not tell (root passes them, yet
    cannot write to a read-only mount or to /proc)."""
    if os.path.exists(train_dir) and not os.path.isdir(train_dir):
        raise ConfigError(f"--train_dir={train_dir}: exists and is not a folder; give a folder")
    existing = os.path.abspath(train_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".appo_probe_", dir=existing))
    except OSError as exc:
        raise ConfigError(f"--train_dir={train_dir}: {existing} is not a writable folder ({exc.strerror}); "
                          "give one that is") from exc


ROOM_CHECK_BELOW = 2**30  # with this much free in both places, no run of this trainer comes near: no check
CHECKPOINT_OVERHEAD = 16 * 2**10  # a checkpoint's bytes besides its tensors (names, counters, the zip archive)


def check_room(cfg: Config, info: EnvInfo) -> None:
    """Before anything is created: can /dev/shm hold the run's weights segments (one per policy and self-play
    snapshot; a container gets 64 MB by default) and what its envs keep there (EnvInfo.shm_bytes_per_env), and
    --train_dir's filesystem its checkpoints (weights, Adam's two moments, the snapshot pool)? When either has less
    than ROOM_CHECK_BELOW free, the model is built once in a short-lived child (torch stays out of this process) to
    know its size; a run that cannot fit is a ConfigError naming both numbers and the fix (exit code 2, nothing
    written)."""
    shm_free, disk_free = free_bytes(SHM_DIR), free_bytes(cfg.train_dir)
    if min(shm_free, disk_free) >= ROOM_CHECK_BELOW:
        return
    nbytes = weights_bytes_in_child((info.obs_space, info.action_space), cfg)
    acting = num_acting_ids(cfg)
    envs = cfg.num_workers * cfg.num_envs_per_worker
    shm_need = acting * nbytes + envs * info.shm_bytes_per_env
    if shm_need > shm_free:
        games = (f" and {envs} env{'s' * (envs > 1)} ({mb(info.shm_bytes_per_env)} each: the env's engine)"
                 if info.shm_bytes_per_env else "")
        raise ConfigError(f"/dev/shm is too small for this run: {acting} weights segment{'s' * (acting > 1)} (one "
                          f"per policy and self-play snapshot, {mb(nbytes)} each){games} need {mb(shm_need)}, "
                          f"{shm_room()}")
    # Weights and Adam's two moments, plus the snapshot pool; --keep_checkpoints of them and the one being written.
    checkpoint = (3 + cfg.self_play_opponents) * nbytes + CHECKPOINT_OVERHEAD
    disk_need = cfg.num_policies * (cfg.keep_checkpoints + 1) * checkpoint
    if disk_need > disk_free:
        raise ConfigError(f"--train_dir={cfg.train_dir}: --keep_checkpoints={cfg.keep_checkpoints} for "
                          f"{cfg.num_policies} {'policy' if cfg.num_policies == 1 else 'policies'} needs about "
                          f"{mb(disk_need)}, {mb(disk_free)} free there; use another --train_dir or a lower "
                          "--keep_checkpoints")


def weights_bytes_in_child(spaces: tuple, cfg) -> int:
    """appo.learning.weights.weights_bytes, computed in a forked child that imports torch and exits."""
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_send_weights_bytes, args=(send, spaces, cfg),
                                                        daemon=True)
    child.start()
    send.close()
    try:
        return receive.recv()
    finally:
        child.join()


def _send_weights_bytes(send, spaces: tuple, cfg) -> None:
    from appo.learning.weights import weights_bytes

    send.send(weights_bytes(spaces, cfg))


def check_device(device: str) -> None:
    """An explicit CUDA device exists. Asked in a child process: CUDA is never initialised in the runner,
    which forks the workers (a forked child cannot use a CUDA context its parent made)."""
    if not device.startswith("cuda"):
        return
    index = int(device.split(":")[1]) if ":" in device else 0
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True)
    count = int(probe.stdout.strip() or 0)
    if index >= count:
        raise ConfigError(f"--device={device}: this machine has {count} CUDA device(s) visible to torch; use "
                          f"{'--device=cuda:0 to cuda:' + str(count - 1) + ', ' if count else ''}--device=cpu or auto")


def check_ray_address(address: str) -> None:
    """A host:port address answers on that port (Ray itself would retry for minutes before it gives up). Empty
    (a private instance) and auto (found by Ray on this machine) are not checked."""
    if address in ("", "auto"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray_address={address}: use host:port of the cluster's head (ray start --head prints "
                          "it), auto, or leave it empty for a Ray instance on this machine")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ConfigError(f"--ray_address={address}: nothing answers there ({exc.strerror or exc}); is the head "
                          "started with 'ray start --head'?") from exc


class _KeptForLogFile(logging.StreamHandler):
    """Shows what `prepare` logs on stderr at once and keeps it: log.txt can only be opened after `prepare`
    (a restart moves the old one away), and it should say which checkpoints were skipped."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        super().emit(record)


@dataclass
class TrainResult:
    """What `train()` returns: where the run is, how far it got and how its policies did at the end."""

    exp_dir: str
    env_steps: int  # over all policies, this run and the runs it resumed
    stats: dict[int, dict[str, float]]  # per policy: mean episode reward, length (and objective) at the end
    checkpoints: list[str | None]  # the newest checkpoint of each policy
    reason: str  # why it stopped
    completed: bool  # reached its budget or target (the experiment is marked done)
    failed: bool = False

    @property
    def checkpoint(self) -> str | None:
        """Policy 0's newest checkpoint."""
        return self.checkpoints[0]


def flag_value(value: Any) -> str:
    """A Python value as the command line spells it: dicts and lists as JSON, the rest as str()."""
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def train(env: str, hooks: Hooks | None = None, **flags: Any) -> TrainResult:
    """Train (or resume) as `python -m appo.train --env=ENV --FLAG=VALUE ...` would, and return the result:
    `train(env="CartPole-v1", experiment="cartpole", target_reward=475)`. Bad flags raise `ConfigError` (an
    env that cannot be made: `EnvError`) before anything is written. `hooks` run besides the ones registered
    with the decorators of appo.hooks. This process runs the runner (call it from the main thread: it handles
    Ctrl-C) and forks the workers."""
    return run([f"--env={env}"] + [f"--{name}={flag_value(value)}" for name, value in flags.items()], hooks)


def run(argv: list[str], hooks: Hooks | None = None) -> TrainResult:
    """The whole program after the command line: validate, prepare the dir, train, summarise. The hooks
    registered with appo.hooks' decorators run, and `hooks` too."""
    kept = _KeptForLogFile()
    log.addHandler(kept)
    log.setLevel(logging.INFO)
    try:
        cfg, given = parse_args(argv)
        prepared = prepare(cfg, given)
    finally:
        log.removeHandler(kept)
    exp_dir = experiment_dir(cfg)
    if prepared is None:
        env_steps = sum(resume_env_steps(exp_dir, cfg.num_policies))
        print(finished_message(exp_dir, env_steps))
        return TrainResult(exp_dir, env_steps, {}, newest_checkpoints(exp_dir, cfg.num_policies), "already finished",
                           completed=True)
    cfg, info, notes, initial_env_steps = prepared
    setup_logging(os.path.join(exp_dir, "log.txt"))
    for handler in log.handlers:
        if isinstance(handler, logging.FileHandler):  # the console has shown them already
            for record in kept.records:
                handler.handle(record)
    for note in notes:
        log.info("Resume override: %s", note)

    from appo.run.runner import Runner

    runner = Runner(cfg, info, exp_dir, initial_env_steps, registered_hooks + (hooks or Hooks()))
    outcome = runner.run()
    if outcome.completed:
        done = os.path.join(exp_dir, "done")
        try:
            atomic_write_text(done, outcome.reason + "\n")
        except OSError as exc:  # the run is complete all the same: run again, it resumes and stops at once
            log.error("The run is complete, but its done marker is not written: %s", write_failure(done, exc))
    return TrainResult(exp_dir, runner.reports.total_env_steps(), runner.reports.final_stats(),
                       newest_checkpoints(exp_dir, cfg.num_policies), outcome.reason, outcome.completed,
                       outcome.failed)


def finished_message(exp_dir: str, env_steps: int) -> str:
    """What a finished experiment says when run again: why it stopped, and how to extend it or start over."""
    with open(os.path.join(exp_dir, "done")) as f:
        reason = f.read().strip()
    return (f"Experiment {exp_dir} is already finished{f' ({reason})' if reason else ''}.\n"
            f"To train it further, raise its budget on the command line (--train_for_env_steps above {env_steps} "
            "env steps,\na new --train_for_seconds, --target_reward or --target_objective), or pass --restart=True to "
            "start over.")


def main(argv: list[str] | None = None) -> int:
    try:
        result = run(sys.argv[1:] if argv is None else argv)
    except (ConfigError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
