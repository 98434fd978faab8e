"""One trial: a normal `python -m appo.train` run in its own experiment dir (<train_dir>/<study>/trial_<number>, its
console output kept there as output.txt), watched while it runs.

- The trainer runs in a process group of its own, so a terminal's Ctrl-C reaches the sweep alone, which stops its
  trials in order; and with PR_SET_PDEATHSIG = SIGTERM, so that if the sweep is killed the trainer stops as on
  Ctrl-C (its workers, then its shared memory) instead of running on unwatched.
- While it runs, its tensorboard summaries (policy 0's, at env steps) are read; once the run has passed a checkpoint
  (every train_for_env_steps / checkpoints env steps) the latest full-window mean (episode/full_window_reward: the
  rule of the targets) at or before it is reported to Optuna, so the median pruner compares trials at the same env
  steps.
- A trial is stopped with SIGINT (the trainer saves a checkpoint and exits), SIGKILL to its group STOP_GRACE_S later.
- When it ends, its value comes from its result.json; a failure keeps the last error line of its output as reason.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from appo.config.cfg import ConfigError
from appo.run.result import RunResult, read_result
from appo.sweep.objectives import Objective, TrialFailure
from appo.tools.plot import curve, summaries_reader
from appo.utils.process import signal_on_parent_death

STOP_GRACE_S = 60.0  # from SIGINT to SIGKILL: the trainer's own shutdown takes up to about 10 s
ERROR_LINE = re.compile(r"error|failed|exception|traceback|killed", re.IGNORECASE)


@dataclass
class Ended:
    """How a trial ended: its state for Optuna, its value (COMPLETE only) and what the results table shows."""

    state: TrialState
    value: float | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    rerun: bool = False  # stopped with the sweep: its params go back in the queue


def in_trainer(sweep_pid: int) -> None:
    """Run in the trainer's process between fork and exec."""
    os.setpgrp()
    signal_on_parent_death(sweep_pid, signal.SIGTERM)


class TrialRun:
    """A trial's trainer process and what has been reported of it so far."""

    def __init__(self, trial: optuna.Trial, command: list[str], exp_dir: str, objective: Objective,
                 checkpoints: list[int]):
        self.trial, self.command, self.exp_dir, self.objective = trial, command, exp_dir, objective
        self.pending = list(checkpoints)  # env steps at which the trial is still to be reported
        self.env_steps = 0  # as far as its summaries have shown
        self.summaries: Any = None  # their reader, once they exist
        self.stop_reason: str | None = None  # why the sweep pruned it
        self.interrupted = False  # stopped because the sweep stops
        self.kill_at: float | None = None
        os.makedirs(exp_dir, exist_ok=True)
        self.output = os.path.join(exp_dir, "output.txt")
        with open(self.output, "w") as out:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            preexec_fn=functools.partial(in_trainer, os.getpid()))
        self.started = time.monotonic()
        self.pidfd = os.pidfd_open(self.process.pid)

    def fileno(self) -> int:
        """Readable when the trainer has exited (select waits on it)."""
        return self.pidfd

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def running(self) -> bool:
        return self.process.poll() is None

    # ---------------------------------------------------------------- while it runs
    def watch(self, bound: float | None) -> None:
        """Report the checkpoints passed since the last look, and prune: when the pruner says so, or, for a
        *_to_target objective, when the trial has used `bound` (what the best trial needed) without the target."""
        if self.stop_reason is not None or self.interrupted or not self.running():
            return
        for step, reward in self.passed_checkpoints():
            self.trial.report(self.objective.intermediate(reward), step)
            if self.trial.should_prune():
                self.stop(f"pruned at {step} env steps: mean reward {reward:.2f}; its best so far is below the "
                          "median of the finished trials there")
                return
        if bound is not None:
            used = self.env_steps if self.objective.cost == "env_steps" else self.seconds()
            if used >= bound:
                self.stop(f"pruned: used {used:.0f} {self.objective.cost.replace('_', ' ')} without reaching the "
                          f"target; the best trial needed {bound:.0f}")

    def passed_checkpoints(self) -> list[tuple[int, float]]:
        """(checkpoint, latest full-window mean reward at or before it) for each checkpoint the run has passed since
        the last call; a checkpoint passed before a full window exists is skipped."""
        try:
            if self.summaries is None:
                self.summaries = summaries_reader(self.exp_dir, 0)
            else:
                self.summaries.Reload()  # what was written since the last look
            steps, _ = curve(self.summaries, self.exp_dir, "episode/reward", "env_steps")
        except ConfigError:  # no summaries, or no episode ended yet
            return []
        self.env_steps = int(steps[-1])
        passed = [c for c in self.pending if c <= steps[-1]]
        self.pending = self.pending[len(passed):]
        try:
            steps, rewards = curve(self.summaries, self.exp_dir, "episode/full_window_reward", "env_steps")
        except ConfigError:  # no full window yet
            return []
        found = []
        for checkpoint in passed:
            i = int(np.searchsorted(steps, checkpoint, side="right")) - 1
            if i >= 0:
                found.append((checkpoint, float(rewards[i])))
        return found

    def stop(self, reason: str | None) -> None:
        """SIGINT now, SIGKILL later (`check_deadline`); `reason` None: the sweep itself stops."""
        if reason is None:
            self.interrupted = True
        else:
            self.stop_reason = reason
        if self.kill_at is None:
            self.kill_at = time.monotonic() + STOP_GRACE_S
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGINT)

    def check_deadline(self) -> None:
        if self.kill_at is not None and time.monotonic() >= self.kill_at and self.running():
            self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its own group: the trainer and its workers

    # ---------------------------------------------------------------- at the end
    def finish(self) -> Ended:
        """After the trainer exited: the checkpoints it passed since the last look, then how the trial ended."""
        code = self.process.wait()
        os.close(self.pidfd)
        attrs: dict[str, Any] = {"seconds": round(self.seconds(), 1)}
        result = self.result()
        if not self.interrupted and self.stop_reason is None:
            for step, reward in self.passed_checkpoints():  # the median of later trials needs them all
                self.trial.report(self.objective.intermediate(reward), step)
        attrs["env_steps"] = result.env_steps if result else self.env_steps
        stopped_here = result is None or not result.completed
        if self.interrupted and stopped_here:
            return Ended(TrialState.FAIL, None, {**attrs, "reason": "the sweep stopped; re-enqueued"}, rerun=True)
        if self.stop_reason is not None and stopped_here:
            return Ended(TrialState.PRUNED, None, {**attrs, "reason": self.stop_reason})
        # A run that completed before the sweep's signal reached it (it was writing its last files): the exit code
        # is the signal's, not a failure of the run.
        signalled_after_completing = self.kill_at is not None and not stopped_here
        if code != 0 and not signalled_after_completing:
            return Ended(TrialState.FAIL, None, {**attrs, "reason": self.error_line(code)})
        if result is None:
            return Ended(TrialState.FAIL, None, {**attrs, "reason": "the trainer wrote no result.json"})
        attrs["reason"] = result.reason
        if not result.completed:
            return Ended(TrialState.FAIL, None, attrs)
        try:
            value, reached = self.objective.value(result)
        except TrialFailure as exc:
            return Ended(TrialState.FAIL, None, {**attrs, "reason": str(exc)})
        if reached is not None:
            attrs["reached"] = reached
        return Ended(TrialState.COMPLETE, value, attrs)

    def result(self) -> RunResult | None:
        """The trainer's result.json; None when it wrote none."""
        try:
            return read_result(self.exp_dir)
        except (OSError, ValueError):
            return None

    def error_line(self, code: int) -> str:
        """The last line of the trainer's output that reads as an error (else its last line), and how it exited."""
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        with contextlib.suppress(OSError), open(self.output, errors="replace") as f:
            lines = [line.strip() for line in f.readlines()[-200:] if line.strip()]
            line = next((line for line in reversed(lines) if ERROR_LINE.search(line)), lines[-1] if lines else "")
            if line:
                return f"{line[:300]} ({how})"
        return how
