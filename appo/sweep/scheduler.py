"""Runs a study's trials, --parallel at a time, from the sweep's main thread (each trainer's PR_SET_PDEATHSIG is tied
to the thread that started it), until the study has --trials finished trials (COMPLETE or PRUNED: a failed trial
does not count, so the total is reached however many fail) and none running anywhere (a trial left RUNNING by a
sweep that is gone is failed once study.abandoned says so, and its params run again here), the sweep is stopped
(Ctrl-C or SIGTERM: the running trials get SIGINT, are marked FAIL and their params enqueued again; a second Ctrl-C
kills them at once), or MAX_FAILURES_IN_A_ROW trials failed one after the other (a sweep that cannot work: its
reasons are in results.md).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from appo.sweep.objectives import Objective
from appo.sweep.space import Sweep
from appo.sweep.study import FINISHED, RENEW_S, claim, count, fail_abandoned
from appo.sweep.trial import Ended, TrialRun
from appo.utils.logs import log

POLL_S = 1.0  # between looks at the running trials' summaries (each look reads only what is new)
MAX_FAILURES_IN_A_ROW = 5
SUMMARIES_INTERVAL_S = 2.0  # --experiment_summaries_interval of a trial, unless the sweep sets it: pruning reads them


def params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
                     for name, value in params.items())


class Scheduler:
    """Asks the study for trials, runs them, tells it how they ended."""

    def __init__(self, study: optuna.Study, storage: optuna.storages.BaseStorage, sweep: Sweep, extra: list[str],
                 objective: Objective, study_dir: str, trials: int, parallel: int, checkpoints: list[int]):
        self.study, self.storage, self.sweep, self.extra, self.objective = study, storage, sweep, extra, objective
        self.study_dir, self.trials, self.parallel, self.checkpoints = study_dir, trials, parallel, checkpoints
        self.running: list[TrialRun] = []
        self.signals = 0  # Ctrl-C and SIGTERM received
        self.failures_in_a_row = 0
        self.claims_due = 0.0  # time.monotonic() of the next `keep_claims`
        self.said_waiting = False  # that this sweep waits for trials of others

    def run(self) -> str:
        """Until done; returns how it ended: "finished", "interrupted" or "gave up"."""
        wake_read, wake_write = os.pipe()  # a signal wakes the wait at once (set_wakeup_fd)
        for fd in (wake_read, wake_write):
            os.set_blocking(fd, False)
        previous_fd = signal.set_wakeup_fd(wake_write)
        previous = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self.signals:
                self.keep_claims()
                self.start_trials()
                if not self.running:
                    elsewhere = 0 if self.gave_up() else count(self.study, TrialState.RUNNING)
                    if not elsewhere:
                        break
                    if not self.said_waiting:
                        log.info("Waiting for %d trials that other sweep processes run (or ran: their claims are "
                                 "checked every %.0f s)", elsewhere, RENEW_S)
                        self.said_waiting = True
                self.wait(wake_read, POLL_S)
                bound = self.cost_bound()
                for run in list(self.running):
                    try:
                        run.watch(bound)
                    except optuna.exceptions.UpdateFinishedTrialError:
                        self.lost(run)
                    self.end_if_over(run)
            if self.signals:
                self.stop_all(wake_read)
                return "interrupted"
            return "gave up" if self.gave_up() else "finished"
        finally:
            for run in self.running:  # only after an error here: leave no trainer behind
                run.kill()
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_read)
            os.close(wake_write)

    def on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1

    def wait(self, wake_read: int, timeout: float) -> None:
        """Until a trainer exits, a signal comes, or `timeout`."""
        ready, _, _ = select.select([wake_read, *self.running], [], [], timeout)
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 64)

    def gave_up(self) -> bool:
        return self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW

    # ---------------------------------------------------------------- claims
    def keep_claims(self) -> None:
        """Every RENEW_S: renew the claims of this sweep's running trials, and fail the trials that no sweep runs any
        more (study.fail_abandoned: their params are enqueued, so this sweep runs them if the study needs them)."""
        if time.monotonic() < self.claims_due:
            return
        self.claims_due = time.monotonic() + RENEW_S
        for run in self.running:
            try:
                claim(run.trial)
            except optuna.exceptions.UpdateFinishedTrialError:
                self.lost(run)
        failed = fail_abandoned(self.study, self.storage)
        if failed:
            log.warning("Trials %s were left running by a sweep process that is gone: marked FAIL, their params "
                        "enqueued to run again", ", ".join(map(str, failed)))

    def lost(self, run: TrialRun) -> None:
        """Another sweep failed this trial as abandoned (its claim had lapsed) and enqueued its params: stop it here;
        its end is not told (`end_if_over`)."""
        if run.stop_reason is None:
            log.warning("Trial %d was failed by another sweep (its claim here had lapsed): stopping it",
                        run.trial.number)
            run.stop("failed by another sweep as abandoned")

    # ---------------------------------------------------------------- trials
    def start_trials(self) -> None:
        """As many new trials as --parallel allows while the finished and running ones (any host's) are fewer than
        --trials. A trial enqueued (by the file, or to re-run one) is asked for first."""
        while len(self.running) < self.parallel and not self.gave_up():
            taken = count(self.study, *FINISHED, TrialState.RUNNING)
            if taken >= self.trials:
                return
            trial = self.study.ask()
            claim(trial)
            params = {param.flag: param.suggest(trial) for param in self.sweep.space}
            exp_dir = os.path.abspath(os.path.join(self.study_dir, f"trial_{trial.number}"))
            command = [sys.executable, "-m", "appo.train", f"--train_dir={os.path.dirname(exp_dir)}",
                       f"--experiment={os.path.basename(exp_dir)}",
                       f"--experiment_summaries_interval={SUMMARIES_INTERVAL_S}",  # the sweep's own flags win
                       *self.sweep.trainer_args(params, self.extra)]
            if os.path.exists(exp_dir):  # a trial of a study since deleted: kept aside, not resumed
                aside = f"{exp_dir}_before_{time.strftime('%Y%m%d-%H%M%S')}"
                os.rename(exp_dir, aside)
                log.warning("%s held an earlier run (of a deleted study?): moved aside to %s", exp_dir, aside)
            trial.set_user_attr("exp_dir", exp_dir)
            self.running.append(TrialRun(trial, command, exp_dir, self.objective, self.checkpoints))
            rerun = trial.user_attrs.get("rerun_of")
            log.info("Trial %d started%s: %s", trial.number, "" if rerun is None else f" (re-run of trial {rerun})",
                     params_text(params))

    def cost_bound(self) -> float | None:
        """For a *_to_target objective, the least cost a finished trial needed to reach the target; None without a
        cost objective or with `--pruner none` (no trial is stopped early, by either rule)."""
        if self.objective.cost is None or isinstance(self.study.pruner, optuna.pruners.NopPruner):
            return None
        return min((trial.value for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if trial.user_attrs.get("reached")), default=None)

    def end_if_over(self, run: TrialRun) -> None:
        run.check_deadline()
        if run.running():
            return
        self.running.remove(run)
        try:
            ended = run.finish()
            self.tell(run.trial, ended)
        except optuna.exceptions.UpdateFinishedTrialError:  # failed meanwhile by another sweep: `lost`
            log.warning("Trial %d ended here after another sweep failed it as abandoned: its end is dropped",
                        run.trial.number)
            return
        if ended.state is TrialState.FAIL and not ended.rerun:
            self.failures_in_a_row += 1
            if self.gave_up():
                log.error("%d trials failed in a row: no new trial is started (their reasons are in results.md)",
                          self.failures_in_a_row)
        elif ended.state is not TrialState.FAIL:
            self.failures_in_a_row = 0

    def tell(self, trial: optuna.Trial, ended: Ended) -> None:
        for key, value in ended.attrs.items():
            trial.set_user_attr(key, value)
        if ended.state is TrialState.COMPLETE:
            self.study.tell(trial, ended.value)
        else:
            self.study.tell(trial, state=ended.state)
        if ended.rerun:
            self.study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number})
        value = "" if ended.value is None else f" value {ended.value:.6g},"
        log.info("Trial %d %s:%s %s env steps in %.0f s: %s", trial.number, ended.state.name, value,
                 ended.attrs.get("env_steps"), ended.attrs["seconds"], ended.attrs.get("reason"))

    def stop_all(self, wake_read: int) -> None:
        """Every running trial gets SIGINT and is waited for (SIGKILL at its deadline, or at a second signal)."""
        log.info("Stopping the sweep: %d running trials get SIGINT (Ctrl-C again: SIGKILL)", len(self.running))
        seen = self.signals
        for run in self.running:
            run.stop(None)
        while self.running:
            self.wait(wake_read, 1.0)
            for run in list(self.running):
                if self.signals > seen:
                    run.kill()
                self.end_if_over(run)
