"""A trainer run in a process of its own, as the benchmark scripts of scripts/ run it: `python -m appo.train` with
the given flags, its output kept, its numbers read from its result.json when it ends (appo/run/result.py), never
from its output's words. A process of its own starts and stops as a user's command does (start-up included in the
time to a target) and leaves nothing behind in the caller."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from appo.config.flags import Config
from appo.run.result import RunResult, read_result, result_path


@dataclass
class TrainerRun:
    """One finished `python -m appo.train` process."""

    returncode: int
    output: str
    """Its stdout and stderr, interleaved, for a failure's message and the scripts' logs."""
    seconds: float
    """From launch to exit."""
    result: RunResult | None
    """Its result.json; None when this launch wrote none (bad input, killed)."""

    @property
    def solved_s(self) -> float | None:
        """Seconds from launch until its --target_reward (or --target_objective) was reached; None: not reached."""
        return None if self.result is None or self.result.target is None else self.result.target.seconds

    @property
    def solved_env_steps(self) -> int | None:
        """Env steps (all policies') when its target was reached; None: not reached."""
        return None if self.result is None or self.result.target is None else self.result.target.env_steps


def flag_value(args: list[str], name: str) -> str:
    """The value `python -m appo.train` takes for --NAME from these flags (the last one given wins, `--name=value`
    or `--name value`), else the flag's default."""
    value = next(field.default for field in dataclasses.fields(Config) if field.name == name)
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
    return value


def experiment_dir_of(args: list[str]) -> str:
    """The experiment dir a trainer with these flags writes."""
    return os.path.join(flag_value(args, "train_dir"), flag_value(args, "experiment"))


STOP_TIMEOUT_S = 60  # how long an interrupted trainer may take to save and exit (it takes 10 s at most on Ctrl-C)


def run_trainer(args: list[str]) -> TrainerRun:
    """Run `python -m appo.train ARGS` to its end. A result.json left by an earlier run in the same experiment dir
    (one this launch did not rewrite) is not taken for this run's."""
    path = result_path(experiment_dir_of(args))
    before = os.path.getmtime(path) if os.path.exists(path) else None
    start = time.monotonic()
    with subprocess.Popen([sys.executable, "-m", "appo.train", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as trainer:
        try:
            output, _ = trainer.communicate()
        except KeyboardInterrupt:  # Ctrl-C, or SIGINT to this process alone: the trainer stops as it does on Ctrl-C
            trainer.send_signal(signal.SIGINT)  # (saves, frees its shared memory), not killed with its segments left
            trainer.wait(timeout=STOP_TIMEOUT_S)
            raise
    done = subprocess.CompletedProcess(trainer.args, trainer.returncode, output)
    seconds = time.monotonic() - start
    result = None
    if os.path.exists(path) and os.path.getmtime(path) != before:
        result = read_result(os.path.dirname(path))
    if done.returncode != 0:
        tail = "".join(done.stdout.splitlines(keepends=True)[-5:])
        print(f"trainer exited with code {done.returncode}: {tail}", file=sys.stderr)
    return TrainerRun(done.returncode, done.stdout, seconds, result)
