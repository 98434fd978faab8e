"""A run from start to end, for the command line (`main`: `python -m appo.train`) and for Python (`train`): check the
input, prepare the experiment dir, run the `Runner`, say how it ended.

Everything that can be wrong with the input (flags, env id, saved cfg.json, this machine: appo/preflight.py) is
checked before the experiment dir is touched; each problem is one line (`ConfigError` or `EnvError`; exit code 2
from the command line). A corrupt checkpoint is not such a problem: it is moved aside and the newest intact one is
used. Torch-free: the runner forks the workers from this process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
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
    parse_keywords,
    resolve,
    save_cfg,
)
from appo.config.checks import FLAG_CHECKS, validate
from appo.envs import EnvError, EnvInfo, env_info
from appo.envs.registry import noise_terminations, random_game_moves
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
from appo.population.pbt import load_population
from appo.preflight import check_extension, check_machine, check_platform
from appo.run.result import RunResult, result_path
from appo.spaces import SpaceError, action_spec, check_encoder_fits, mirror_axes, obs_spaces
from appo.utils.files import atomic_write_text
from appo.utils.logs import log, logger_restored, setup_logging
from appo.utils.process import EXIT_BAD_INPUT
from appo.utils.resources import write_failure

# Flags that decide when a run stops: raising one on the command line extends a finished run.
BUDGET_FLAGS = ("train_for_env_steps", "train_for_seconds", "target_reward", "target_objective")


def main(argv: list[str] | None = None) -> int:
    """`python -m appo.train`, or a launcher's: the exit code (2: bad input, said in one line on stderr)."""
    try:
        result = run(*parse_args(sys.argv[1:] if argv is None else argv, FLAG_CHECKS))
    except (ConfigError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 1 if result.failed else 0


def train(env: str, hooks: Hooks | None = None, **flags: Any) -> TrainResult:
    """Train (or resume) as `python -m appo.train --env=ENV --FLAG=VALUE ...` would, and return the result:
    `train(env="CartPole-v1", experiment="cartpole", target_reward=475)`. Flags are Python values
    (appo/config/cfg.py `parse_keywords`); bad ones raise `ConfigError` with the command line's error line (an env
    that cannot be made: `EnvError`) before anything is written. `hooks` run besides the ones registered with the
    decorators of appo.hooks. This process runs the runner (call it from the main thread: it handles Ctrl-C) and
    forks the workers. The 'appo' logger is set up for the run's terminal and log file while it runs, and put back as
    it was when it returns or raises, since the caller's process goes on."""
    if threading.current_thread() is not threading.main_thread():
        raise ConfigError("train() runs the trainer in its process's main thread, whose signal handlers catch Ctrl-C: "
                          "call it there, or run python -m appo.train as a process of its own")
    if hooks is not None:
        problem = hooks.problem() if isinstance(hooks, Hooks) else f"a {type(hooks).__name__}, not appo.hooks.Hooks"
        if problem:
            raise ConfigError(f"hooks: {problem}")
    with logger_restored():
        return run(*parse_keywords({"env": env, **flags}, FLAG_CHECKS), hooks)


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


def run(cfg: Config, given: set[str], hooks: Hooks | None = None) -> TrainResult:
    """The whole program after parsing (`given`: the flags the user gave, which override a resumed run's): check,
    prepare the dir, train, summarise. The hooks registered with appo.hooks' decorators run, and `hooks` too."""
    started = time.monotonic()
    kept = _KeptForLogFile()
    log.addHandler(kept)
    log.setLevel(logging.INFO)
    try:
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
    stats = runner.reports.final_stats()
    checkpoints = newest_checkpoints(exp_dir, cfg.num_policies)
    numbers = runner.reports.numbers
    write_result(exp_dir, RunResult(outcome.reason, outcome.completed, outcome.failed,
                                    env_steps=runner.reports.total_env_steps(),
                                    seconds=round(time.monotonic() - started, 3), stats=stats,
                                    best_rewards=dict(enumerate(numbers.best_rewards)),
                                    final_rewards=dict(enumerate(numbers.final_rewards())),
                                    checkpoints=dict(enumerate(checkpoints)),
                                    faults=runner.reports.tally.fault_counts(), target=outcome.target))
    if outcome.completed:
        done = os.path.join(exp_dir, "done")
        try:
            atomic_write_text(done, outcome.reason + "\n")
        except OSError as exc:  # the run is complete all the same: run again, it resumes and stops at once
            log.error("The run is complete, but its done marker is not written: %s", write_failure(done, exc))
    return TrainResult(exp_dir, runner.reports.total_env_steps(), stats, checkpoints, outcome.reason,
                       outcome.completed, outcome.failed)


def write_result(exp_dir: str, result: RunResult) -> None:
    """`<exp_dir>/result.json`: how the run ended, in a form programs read (appo/run/result.py `read_result`: the
    sweeps, the benchmark scripts, the tests) rather than the log's words. `seconds` is this run's (a resumed run's
    earlier sessions are not counted); a reached target's `seconds` count from the process's start, as its stop line
    says."""
    path = result_path(exp_dir)
    try:
        atomic_write_text(path, json.dumps(result.to_dict(), indent=2) + "\n")
    except OSError as exc:  # the run itself is over and said how it ended in the log
        log.error("The run's result.json is not written: %s", write_failure(path, exc))


def prepare(cfg: Config, given: set[str]) -> tuple[Config, EnvInfo, list[str], list[int]] | None:
    """Validate everything, then (re)create the experiment dir; returns the run's final `Config` (resumed, with
    the env's defaults, resolved). None means: already finished (and no budget flag given that differs from the
    saved one; with one, the finished run is extended)."""
    check_platform()
    exp_dir = experiment_dir(cfg)
    notes: list[str] = []
    extended: dict[str, tuple[Any, Any]] = {}  # budget flag -> (saved value, new value), when extending
    resuming = not cfg.restart and os.path.exists(os.path.join(exp_dir, "cfg.json"))
    if not resuming:
        validate(cfg)  # a resumed run's flags are validated once merged with its saved ones
    else:
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
    info = env_info(cfg.env, env_kwargs(cfg), measure_step=not resuming and not vectorised,
                    action_mask=cfg.action_mask)
    if vectorised and not resuming:
        info = dataclasses.replace(info, step_seconds=sub_env_step_seconds(cfg.env, env_kwargs(cfg)))
    try:
        obs_spaces(info.obs_space), action_spec(info.action_space)
    except SpaceError as exc:  # before the rules read the spaces
        raise EnvError(f"--env={cfg.env}: {exc}") from exc
    # A resumed run keeps the choices saved in its cfg.json; the lines are logged once all else is valid.
    auto_lines: list[str] = []
    if not resuming:
        cfg, info, auto_lines = _apply_auto(cfg, given, info)
    cfg = resolve(cfg, info.num_agents, info.turn_based)
    check_spaces_fit(cfg, info)
    check_machine(cfg, info)
    for line in auto_lines:
        log.info(line)
    warn_of_evaluation_by_seats(cfg, info)
    # Everything is valid: only now does the experiment dir change.
    if cfg.restart and os.path.exists(exp_dir):
        move_aside(exp_dir)
    # --num_policies cannot change on resume
    initial_env_steps = resume_env_steps(exp_dir, cfg.num_policies) if resuming else [0] * cfg.num_policies
    if extended or (resuming and "train_for_env_steps" in given):
        check_extension(cfg, exp_dir, sum(initial_env_steps), finished=bool(extended))
    if extended:
        os.remove(os.path.join(exp_dir, "done"))
        log.info("Extending the finished experiment %s: %s", exp_dir,
                 ", ".join(f"--{flag}={old} -> {new}" for flag, (old, new) in extended.items()))
    os.makedirs(exp_dir, exist_ok=True)
    save_cfg(cfg, os.path.join(exp_dir, "cfg.json"))
    return cfg, info, notes, initial_env_steps


def warn_of_evaluation_by_seats(cfg: Config, info: EnvInfo) -> None:
    """The evaluation plays a policy on every seat of a multi-agent env and scores the mean over them: in a zero-sum
    game that is 0 whatever the policy, and a self-play run's best.pth would keep its first evaluation."""
    if cfg.eval_every_env_steps and info.num_agents > 1:
        log.warning("--eval_every_env_steps plays each policy on every seat of --env=%s and scores the mean over the "
                    "seats, which a zero-sum game makes 0 whatever the policy; score a game against a fixed player "
                    "with python -m appo.versus", cfg.env)


def move_aside(exp_dir: str) -> None:
    """--restart=True: the old experiment is renamed, never deleted."""
    aside = free_path(f"{os.path.normpath(exp_dir)}_before_restart_{time.strftime('%Y%m%d-%H%M%S')}")
    os.rename(exp_dir, aside)
    log.info("Restart: moved the old experiment %s aside to %s; starting over", exp_dir, aside)


def check_spaces_fit(cfg: Config, info: EnvInfo) -> None:
    """The buffers' layout, a CNN that --encoder names, and the model's mirror where asked, fit the env's spaces;
    ConfigError naming the env."""
    try:
        Layout.from_cfg(cfg, info.obs_space, info.action_space, info.num_agents)
        check_encoder_fits(cfg.encoder, info.obs_space)
        if cfg.mirror_symmetry:
            mirror_axes(info.obs_space, info.action_space)
    except TypeError as exc:  # SpaceError is one
        raise ConfigError(f"--env={cfg.env}: {exc}") from exc


def _apply_auto(cfg: Config, given: set[str], info: EnvInfo) -> tuple[Config, EnvInfo, list[str]]:
    """The auto rules at the start of a new experiment: the env's noise and a turn-based game's length probed where a
    rule needs them, then the rules applied (`auto.apply`); returns the config, the env's info with the probes'
    answers, and the "auto:" lines."""
    if auto.probes_noise(cfg, info, given):
        probed = noise_terminations(cfg.env, env_kwargs(cfg), auto.narrow_stddev(info))
        info = dataclasses.replace(info, noise_terminations=probed)
    if info.turn_based and "random_opening_moves" not in given:
        info = dataclasses.replace(info, random_game_moves=random_game_moves(cfg.env, env_kwargs(cfg)))
    masked = cfg.action_mask
    cfg, lines = auto.apply(cfg, given, info)
    if cfg.action_mask != masked:  # masks read from info join the observation: the spaces the model sees
        masked_info = env_info(cfg.env, env_kwargs(cfg), action_mask=cfg.action_mask)
        info = dataclasses.replace(info, obs_space=masked_info.obs_space)
    return cfg, info, lines


def new_experiment_defaults(argv: list[str]) -> tuple[Config, list[str]]:
    """The config a new experiment of `python -m appo.train ARGV` would start with after the auto rules, and their
    "auto:" lines, without starting it or touching its dir: scripts/benchmark.py compares it with the choices a
    resumed run keeps in its cfg.json, so one run never mixes the defaults of two commits. The env is made and probed
    as at start-up, but no step is timed, so the rule that follows a timing does not apply: the sampler's sizing
    (--num_envs_per_worker, --actor_niceness: throughput, not learning)."""
    cfg, given = parse_args(argv)
    info = env_info(cfg.env, env_kwargs(cfg), measure_step=False, action_mask=cfg.action_mask)
    cfg, info, lines = _apply_auto(cfg, given, info)
    return resolve(cfg, info.num_agents, info.turn_based), lines  # resolved, as cfg.json keeps it


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


class _KeptForLogFile(logging.StreamHandler):
    """Shows what `prepare` logs on stderr at once and keeps it: log.txt can only be opened after `prepare`
    (a restart moves the old one away), and it should say which checkpoints were skipped."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        super().emit(record)


def finished_message(exp_dir: str, env_steps: int) -> str:
    """What a finished experiment says when run again: why it stopped, and how to extend it or start over."""
    with open(os.path.join(exp_dir, "done")) as f:
        reason = f.read().strip()
    return (f"Experiment {exp_dir} is already finished{f' ({reason})' if reason else ''}.\n"
            f"To train it further, raise its budget on the command line (--train_for_env_steps above {env_steps} "
            "env steps,\na new --train_for_seconds, --target_reward or --target_objective), or pass --restart=True to "
            "start over.")
