"""The runner (main process): builds the run's shared memory and queues (appo/run/graph.py), starts every worker
through the supervisor, replaces the ones that die or hang, aggregates their reports, runs PBT, decides when to
stop, and always joins its children and removes its shared memory.

The main process never imports torch: workers are forked from it, and only the inference and learner processes
import torch after the fork (actors stay light, CUDA is never initialised here). It writes control.runner.* and,
through PbtDriver, the reward shaping.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import time
from dataclasses import replace

import psutil
from faster_fifo import Empty, Full

from appo.config.flags import Config
from appo.config.topology import lockstep, num_acting_ids
from appo.config.views import RunnerConfig
from appo.envs import EnvInfo
from appo.hooks import Hooks
from appo.learning.checkpoint import newest_checkpoints
from appo.memory.segments import remove_orphan_segments, unlink_segment
from appo.messages import (
    ActorReport,
    CheckpointSaved,
    ClusterReport,
    EvaluateRequest,
    Evaluation,
    InferenceReport,
    LearnerIteration,
    LearnerReport,
    WorkerFailed,
    WorkerReady,
)
from appo.population.ratings import Ratings
from appo.run.graph import build_context, named_queues, start_workers
from appo.run.pbt_driver import PbtDriver
from appo.run.reporting import Reports
from appo.run.reporting.benchmark import measure_raw_limit
from appo.run.serial import SerialSupervisor
from appo.run.stopping import Outcome, budget_outcome, failed, stuck_outcome
from appo.run.supervisor import Supervisor
from appo.tracking import run_status
from appo.utils.files import atomic_write_text
from appo.utils.logs import log
from appo.utils.queues import DeadHolderWatch

SHUTDOWN_SECONDS = 8.0


class Runner:
    """Owns the run's workers (through the supervisor), its reports, ratings and population."""

    def __init__(self, cfg: Config, env: EnvInfo, exp_dir: str, initial_env_steps: list[int],
                 hooks: Hooks | None = None):
        """`cfg` is the run's whole config: the workers get it (each narrows it to its role's view)."""
        self.cfg, self.env, self.exp_dir = RunnerConfig.of(cfg), env, exp_dir  # the flags the runner itself reads
        self.run_token = f"{os.getpid()}_{secrets.token_hex(3)}"
        self.ctx = build_context(cfg, env, exp_dir, self.run_token)
        self.group = None  # the sampler group, once started (None on a Ray cluster)
        # Evaluation requests; each policy is due again --eval_every_env_steps after its last request.
        self.next_eval = [steps + cfg.eval_every_env_steps for steps in initial_env_steps]
        self.hooks = hooks or Hooks()
        self.hook_failure: str | None = None
        self.reports = Reports(cfg, exp_dir, initial_env_steps, env.frames_per_step)  # the trackers keep all of cfg
        # Who beats whom, when games have players of different acting ids (appo/population/ratings.py).
        self.ratings = Ratings.load(exp_dir) if env.num_agents > 1 and num_acting_ids(cfg) > 1 else None
        self.reports.ratings = self.ratings
        self.supervisor = (SerialSupervisor if cfg.serial_mode else Supervisor)(self.ctx.queues.report,
                                                                                 cfg.max_worker_restarts)
        self.pbt = PbtDriver(self.ctx, env, self.reports, self.ratings) if cfg.with_pbt else None
        self.interrupted = False
        self.report_watch = DeadHolderWatch(self.ctx.queues.report)  # a worker killed inside a put blocks no read

    def start(self) -> None:
        removed = remove_orphan_segments()
        if removed:
            log.info("Removed %d shared-memory segments left by runs whose main process died: %s", len(removed),
                     ", ".join(removed))
        self.group = start_workers(self.ctx, self.env, self.supervisor,
                                   lambda p: None if self.pbt is None else self.pbt.hyperparams(p),
                                   bool(self.hooks.on_learner_iteration))
        self.reports.start_tracking()  # threads only now that the workers are forked
        self.report_watch.start()

    # ---------------------------------------------------------------- main loop
    def run(self) -> Outcome:
        previous_handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        log.info("Starting %d actor workers x %d envs, %d policies; %d trajectory slots of %d steps",
                 self.cfg.num_workers, self.cfg.num_envs_per_worker, self.cfg.num_policies,
                 self.ctx.layout.num_slots, self.cfg.rollout)
        if lockstep(self.cfg):
            log.info("Seeded single-worker run: the actor waits for each policy update, so the run is repeatable")
        outcome = failed("error")
        try:
            if self.cfg.benchmark and self.cfg.benchmark_raw_limit_s > 0 and self.cfg.backend == "local":
                self.reports.raw_limit = measure_raw_limit(self.cfg)  # before any worker: the cores are the env's
            self.start()
            outcome = self._loop()
            if self.cfg.benchmark:  # measured before shutdown, so teardown does not count
                self.write_benchmark()
        finally:
            outcome = self.shutdown(outcome)
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
        self._log_final(outcome)
        return outcome

    def _on_signal(self, signum, frame) -> None:
        self.interrupted = True

    def _loop(self) -> Outcome:
        cfg, reports = self.cfg, self.reports
        start = time.monotonic()
        last_status = last_summary = start
        while True:
            self.supervisor.step_workers()
            self._drain_reports(timeout=self.supervisor.REPORT_WAIT_S)
            reports.tick(self.ctx.control.learners.env_steps)
            now = time.monotonic()
            outcome = self._check_stop(now - start)
            if outcome is not None:
                return outcome
            if self.pbt is not None:
                self.pbt.step()
            if self.ctx.queues.evaluator_inbox is not None:
                self._request_evaluations()
            status_due = now - last_status >= cfg.report_interval
            summary_due = now - last_summary >= cfg.experiment_summaries_interval
            if status_due or summary_due:  # both show the memory: measured once for them
                memory = self._memory_mb()
                reports.on_memory(memory)
            if status_due:
                for line in reports.status_line().splitlines():  # one log line each: all fit 120 columns
                    log.info(line)
                last_status = now
            if summary_due:
                reports.write_summaries(memory)
                if self.ratings is not None:
                    self.ratings.save(self.exp_dir)
                last_summary = now

    def _drain_reports(self, timeout: float) -> None:
        try:
            messages = self.ctx.queues.report.get_many(timeout=timeout)
        except Empty:
            return
        for message in messages:
            self._dispatch(message)

    def _dispatch(self, message: object) -> None:
        """Hand one report to whoever keeps its numbers, and to the user's hooks."""
        match message:
            case ActorReport():
                self.reports.on_actor(message)
                for game in message.games if self.ratings is not None else ():
                    self.ratings.record_game(game.players, game.scores)
                for episode in message.episodes if self.hooks.on_episode_end else ():
                    self._call_hooks("on_episode_end", replace(episode,
                                                               env_steps=self.reports.env_steps[episode.policy]))
            case InferenceReport():
                self.reports.on_inference(message)
            case LearnerReport():
                self.reports.on_learner(message)
            case LearnerIteration():
                self._call_hooks("on_learner_iteration", message)
            case CheckpointSaved():
                self._call_hooks("on_checkpoint", message)
            case ClusterReport():
                self.reports.on_cluster(message)
            case Evaluation():
                self.reports.on_evaluation(message)
                self._call_hooks("on_evaluation", message)
            case WorkerReady():
                self.supervisor.on_ready(message.name)
            case WorkerFailed():
                self.supervisor.on_failed(message)
            case _:
                raise TypeError(f"the report queue carried an unknown message: {message!r}")

    def _call_hooks(self, name: str, event: object) -> None:
        """Run the user's hooks for an event; the first one that raises stops the run (see appo/hooks.py)."""
        for hook in getattr(self.hooks, name):
            if self.hook_failure is not None:
                return
            try:
                hook(event)
            except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit() in a hook stops the run the same
                log.exception("The %s hook %s raised", name, getattr(hook, "__qualname__", hook))  # way, recorded
                self.hook_failure = (f"the {name} hook {getattr(hook, '__qualname__', hook)} raised "
                                     f"{type(exc).__name__}: {exc}")

    def _request_evaluations(self) -> None:
        """Ask the evaluator for every policy that took --eval_every_env_steps since it was last asked."""
        for p, steps in enumerate(self.reports.env_steps):
            if steps >= self.next_eval[p]:
                with contextlib.suppress(Full):
                    self.ctx.queues.evaluator_inbox.put_nowait(EvaluateRequest(p))
                self.next_eval[p] = steps + self.cfg.eval_every_env_steps

    # ---------------------------------------------------------------- supervision and stopping
    def _check_stop(self, elapsed: float) -> Outcome | None:
        if self.group is not None:
            self.group.kill_hung_actors(self.supervisor)
        reason = self.supervisor.replace_dead(named_queues(self.ctx, self.group),
                                              lambda: self._drain_reports(timeout=0.0))
        self.reports.restarts = self.supervisor.restart_counts()
        if reason is not None:
            return failed(reason)
        if self.interrupted:
            return Outcome("interrupted", completed=False)
        if self.hook_failure is not None:
            return failed(self.hook_failure)
        return (stuck_outcome(self.cfg, self.supervisor, self.reports.last_progress, self._blocked_in)
                or budget_outcome(self.cfg, self.reports, elapsed))

    def _blocked_in(self) -> str:
        """What every worker is doing, for the stall report: actors' current env call, the others' last report."""
        now = time.monotonic()
        states = {name: f"{state} (reported {now - when:.0f} s ago)"
                  for name, (state, when) in self.reports.states.items()}
        if self.group is not None:
            states.update(self.group.env_calls())
        return "; ".join(f"{name}: {state}" for name, state in sorted(states.items()))

    def _memory_mb(self) -> dict[str, float]:
        memory = {"runner": psutil.Process().memory_info().rss / 2**20}
        for process in self.supervisor.processes():
            with contextlib.suppress(psutil.NoSuchProcess, ValueError):
                memory[process.name] = psutil.Process(process.pid).memory_info().rss / 2**20
        return memory

    # ---------------------------------------------------------------- shutdown
    def shutdown(self, outcome: Outcome) -> Outcome:
        """Stop everyone (learners save a checkpoint), join with a deadline, free shared memory; the last summaries,
        and the trackers' runs end as the run did. Returns how it did: failed where a hook raised on the reports
        drained here (the final checkpoint's), else `outcome`."""
        self.ctx.control.runner.stop[0] = 1
        self.supervisor.join_all(time.monotonic() + SHUTDOWN_SECONDS, lambda: self._drain_reports(timeout=0.0))
        self._drain_reports(timeout=0.0)
        if self.hook_failure is not None and not outcome.failed:
            outcome = failed(self.hook_failure)
        self.report_watch.stop()
        for name in self.ctx.weights_names:
            unlink_segment(name)
        self.reports.write_summaries({})
        if self.ratings is not None:
            self.ratings.save(self.exp_dir)
        self.reports.close(run_status(outcome.completed, outcome.failed))
        return outcome

    def write_benchmark(self) -> None:
        """Print the benchmark table and save it as benchmark.json."""
        from appo.run.reporting import format_benchmark

        summary = self.reports.benchmark_summary(self.cfg.env)
        log.info("\n%s", format_benchmark(summary))
        atomic_write_text(os.path.join(self.exp_dir, "benchmark.json"), json.dumps(summary, indent=2))

    def _log_final(self, outcome: Outcome) -> None:
        for line in self.reports.status_line().splitlines():
            log.info(line)
        if outcome.failed:
            log.error("Run failed: %s", outcome.reason)
        else:
            log.info("Stopped: %s", outcome.reason)
        for line in self.reports.summary_line(newest_checkpoints(self.exp_dir, self.cfg.num_policies)).splitlines():
            log.info(line)
        if self.ratings is not None and self.ratings.elo:
            for line in self.ratings.table():
                log.info(line)
