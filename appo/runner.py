"""The runner (main process): builds shared buffers and queues, starts every worker, aggregates their
reports, decides when to stop, and always joins its children and removes its shared memory.

The main process never imports torch: workers are forked from it, and only the inference and
learner processes import torch after the fork (actors stay light, CUDA is never initialised here).
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import pickle
import random
import secrets
import signal
import time
from dataclasses import dataclass

import psutil
from faster_fifo import Empty, Queue

from appo import pbt
from appo.buffers import (
    Layout,
    SamplerState,
    TrajBuffers,
    remove_orphan_segments,
    unlink_segment,
    weights_segment_name,
)
from appo.cfg import inference_groups, inference_name, lockstep
from envs import EnvInfo
from utils.logs import log
from utils.process import start_component

SHUTDOWN_SECONDS = 8.0


def make_queue(max_size_bytes: int = 1_000_000) -> Queue:
    """A faster-fifo queue with plain pickle: the default ForkingPickler costs ~10 us more per message."""
    return Queue(max_size_bytes=max_size_bytes, loads=pickle.loads,
                 dumps=functools.partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL))


@dataclass
class Outcome:
    """Why the run stopped; `completed` runs get the `done` marker."""

    reason: str
    completed: bool
    failed: bool = False


class Runner:
    def __init__(self, cfg, env: EnvInfo, exp_dir: str, initial_env_steps: list[int]):
        from appo.reporting import Reports

        self.cfg, self.env, self.exp_dir = cfg, env, exp_dir
        self.spaces = (env.obs_space, env.action_space)
        self.layout = Layout.from_cfg(cfg, env.obs_space, env.action_space, env.num_agents)
        self.traj = TrajBuffers(self.layout)
        groups = inference_groups(cfg)
        self.sampler = SamplerState(self.layout, cfg.num_policies, (len(groups), cfg.policy_workers_per_policy),
                                    tuple(env.reward_shaping))
        self.run_token = f"{os.getpid()}_{secrets.token_hex(3)}"
        self.report_queue = make_queue(10_000_000)
        self.actor_inboxes = [make_queue() for _ in range(cfg.num_workers)]
        # Wake-up queues of the inference workers, [group][index]; requests themselves go through memory.
        self.inference_queues = [[make_queue(10_000) for _ in range(cfg.policy_workers_per_policy)]
                                 for _ in groups]
        self.learner_inboxes = [make_queue() for _ in range(cfg.num_policies)]
        self.reports = Reports(cfg, exp_dir, initial_env_steps, env.frames_per_step)
        self.processes: list[multiprocessing.Process] = []
        self.population: list[pbt.Member] | None = None
        if cfg.with_pbt:
            self.population = pbt.restore_population(exp_dir, cfg, env.reward_shaping)
            self.pbt_settings = pbt.Settings.from_cfg(cfg)
            self.pbt_rng = random.Random(cfg.seed)
            self._publish_population()
        self.ready: set[str] = set()
        self.interrupted = False
        self.last_error: str | None = None

    # ---------------------------------------------------------------- processes
    def _spawn(self, name: str, module: str, function: str, *args) -> None:
        context = multiprocessing.get_context("fork")
        process = context.Process(target=start_component, name=name,
                                  args=(name, self.report_queue, module, function, os.getpid(), *args), daemon=True)
        process.start()
        self.processes.append(process)

    def start(self) -> None:
        removed = remove_orphan_segments()
        if removed:
            log.info("Removed %d shared-memory segments left by runs whose main process died: %s", len(removed),
                     ", ".join(removed))
        cfg, layout = self.cfg, self.layout
        weights_names = [weights_segment_name(self.run_token, p) for p in range(cfg.num_policies)]
        for p in range(cfg.num_policies):
            hyperparams = None if self.population is None else self.population[p].hyperparams
            self._spawn(f"learner_p{p}", "appo.learner", "run_learner", cfg, layout, self.spaces, p, self.traj,
                        self.sampler, self.learner_inboxes, self.actor_inboxes, self.report_queue, weights_names[p],
                        self.exp_dir, hyperparams)
        for g in range(len(self.inference_queues)):
            for i in range(cfg.policy_workers_per_policy):
                self._spawn(inference_name(cfg, g, i), "appo.inference_worker", "run_inference_worker", cfg, layout,
                            self.spaces, g, i, self.traj, self.sampler, self.inference_queues[g][i],
                            self.actor_inboxes, self.report_queue, weights_names)
        for w in range(cfg.num_workers):
            self._spawn(f"actor_{w}", "appo.actor_worker", "run_actor_worker", cfg, layout, w, self.traj,
                        self.sampler, self.actor_inboxes[w], self.inference_queues, self.learner_inboxes,
                        self.report_queue)

    # ---------------------------------------------------------------- main loop
    def run(self) -> Outcome:
        previous_handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        log.info("Starting %d actor workers x %d envs, %d policies; %d trajectory slots of %d steps",
                 self.cfg.num_workers, self.cfg.num_envs_per_worker, self.cfg.num_policies,
                 self.layout.num_slots, self.cfg.rollout)
        if lockstep(self.cfg):
            log.info("Seeded single-worker run: the actor waits for each policy update, so the run is repeatable")
        outcome = Outcome("error", completed=False, failed=True)
        try:
            self.start()
            outcome = self._loop()
            if self.cfg.benchmark:  # measured before shutdown, so teardown does not count
                self.write_benchmark()
        finally:
            self.shutdown()
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
            self._drain_reports(timeout=0.05)
            reports.tick()
            now = time.monotonic()
            outcome = self._check_stop(now - start)
            if outcome is not None:
                return outcome
            if self.population is not None:
                self._pbt_step()
            if now - last_status >= cfg.report_interval:
                log.info(reports.status_line())
                last_status = now
            if now - last_summary >= cfg.experiment_summaries_interval:
                reports.write_summaries(self._memory_mb())
                last_summary = now

    def _drain_reports(self, timeout: float) -> None:
        try:
            messages = self.report_queue.get_many(timeout=timeout)
        except Empty:
            return
        for message in messages:
            kind = message[0]
            if kind == "actor":
                self.reports.on_actor(message[1], message[2])
            elif kind == "inference":
                self.reports.on_inference(message[1], message[2])
            elif kind == "learner":
                self.reports.on_learner(message[1], message[2])
            elif kind == "ready":
                self.ready.add(message[1])
            elif kind == "error":
                self.last_error = f"{message[1]} crashed:\n{message[2]}"

    def _check_stop(self, elapsed: float) -> Outcome | None:
        cfg, reports = self.cfg, self.reports
        if self.last_error is not None:
            return Outcome(self.last_error, completed=False, failed=True)
        for process in self.processes:
            if process.exitcode is not None:
                return Outcome(f"{process.name} exited unexpectedly with code {process.exitcode}",
                               completed=False, failed=True)
        actors_ready = sum(name.startswith("actor_") for name in self.ready)
        if actors_ready < cfg.num_workers and elapsed > cfg.reset_timeout_seconds:
            return Outcome(f"only {actors_ready} of {cfg.num_workers} actor workers created and reset their envs "
                           f"within --reset_timeout_seconds={cfg.reset_timeout_seconds}", completed=False,
                           failed=True)
        if self.interrupted:
            return Outcome("interrupted", completed=False)
        stalled = time.monotonic() - reports.last_progress
        if actors_ready == cfg.num_workers and stalled > cfg.stall_timeout_seconds:
            states = "; ".join(f"{name}: {state}" for name, state in sorted(reports.states.items()))
            return Outcome(f"no env step for {stalled:.0f} s (--stall_timeout_seconds); worker states: {states}",
                           completed=False, failed=True)
        if cfg.benchmark:  # the budgets count the measured period only, so it is never empty
            _, env_steps, samples = reports.measured()
            if env_steps >= cfg.benchmark_env_steps:
                return Outcome(f"benchmark budget --benchmark_env_steps={cfg.benchmark_env_steps} reached", True)
            if samples >= cfg.benchmark_samples:
                return Outcome(f"benchmark budget --benchmark_samples={cfg.benchmark_samples} reached", True)
        if reports.total_env_steps() >= cfg.train_for_env_steps:
            return Outcome(f"reached --train_for_env_steps={cfg.train_for_env_steps}", completed=True)
        if elapsed >= cfg.train_for_seconds:
            return Outcome(f"reached --train_for_seconds={cfg.train_for_seconds}", completed=True)
        for measure, target in (("reward", cfg.target_reward), ("objective", cfg.target_objective)):
            solved = None if target is None else reports.solved_policy(target, measure)
            if solved is not None:
                launched = time.time() - psutil.Process().create_time()
                return Outcome(
                    f"target {measure} {target} reached by policy {solved[0]}: mean {solved[1]:.2f} over "
                    f"{cfg.stats_avg} episodes, {launched:.1f} s after launch, "
                    f"{reports.total_env_steps()} env steps", completed=True)
        return None

    # ---------------------------------------------------------------- population-based training
    def _pbt_step(self) -> None:
        """Judge the policies whose period is up and carry out the decisions (see appo/pbt.py)."""
        reports = self.reports
        objectives = [reports.objective(p) for p in range(self.cfg.num_policies)]
        events = pbt.decide(reports.env_steps, objectives, self.population, self.pbt_settings, self.pbt_rng)
        for event in events:
            pbt.apply(self.population, event)
            pbt.append_history(self.exp_dir, event)
            if event.kind == "keep":
                continue
            log.info(event.describe())
            self.learner_inboxes[event.policy].put(("hyperparams", event.hyperparams_after))
            if event.donor is not None:
                self.learner_inboxes[event.donor].put(("export", event.policy))
                reports.forget_objective(event.policy)
        if events:
            self._publish_population()
            pbt.save_population(self.exp_dir, self.population)
            for event in events:
                reports.write_pbt_summaries(event.policy)

    def _publish_population(self) -> None:
        """Reward shaping to the actors (shared memory), hyper-parameters to the summaries and status line."""
        keys = self.sampler.shaping_keys
        for p, member in enumerate(self.population):
            self.sampler.reward_shaping[p, :len(keys)] = [member.shaping[key] for key in keys]
        self.reports.hyperparams = [
            {**member.hyperparams, **{f"shaping_{key}": value for key, value in member.shaping.items()}}
            for member in self.population]

    def _memory_mb(self) -> dict[str, float]:
        memory = {"runner": psutil.Process().memory_info().rss / 2**20}
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess, ValueError):
                memory[process.name] = psutil.Process(process.pid).memory_info().rss / 2**20
        return memory

    # ---------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Stop everyone (learners save a checkpoint), join with a deadline, free shared memory."""
        self.sampler.stop[0] = 1
        deadline = time.monotonic() + SHUTDOWN_SECONDS
        for process in self.processes:
            while process.is_alive() and time.monotonic() < deadline:
                self._drain_reports(timeout=0.0)
                process.join(timeout=0.05)
        for process in self.processes:
            if process.is_alive():
                log.warning("%s did not stop in time; terminating it", process.name)
                process.terminate()
                process.join(timeout=1.0)
            if process.is_alive():
                process.kill()
                process.join()
        self._drain_reports(timeout=0.0)
        for p in range(self.cfg.num_policies):
            unlink_segment(weights_segment_name(self.run_token, p))
        self.reports.write_summaries({})
        self.reports.close()

    def write_benchmark(self) -> None:
        """Print the benchmark table and save it as benchmark.json (atomically)."""
        from appo.reporting import format_benchmark

        summary = self.reports.benchmark_summary(self.cfg.env)
        log.info("\n%s", format_benchmark(summary))
        path = os.path.join(self.exp_dir, "benchmark.json")
        with open(f"{path}.tmp", "w") as f:
            json.dump(summary, f, indent=2)
        os.replace(f"{path}.tmp", path)

    def _log_final(self, outcome: Outcome) -> None:
        log.info(self.reports.status_line())
        if outcome.failed:
            log.error("Run failed: %s", outcome.reason)
        else:
            log.info("Stopped: %s", outcome.reason)
