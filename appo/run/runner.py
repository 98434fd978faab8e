"""The runner (main process): builds shared buffers and queues, starts every worker (through the
supervisor), replaces the ones that die or hang, aggregates their reports, decides when to stop, and
always joins its children and removes its shared memory.

The main process never imports torch: workers are forked from it, and only the inference and
learner processes import torch after the fork (actors stay light, CUDA is never initialised here).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import time
from dataclasses import dataclass

import psutil
from faster_fifo import Empty, Full

from appo.config.topology import inference_shards, lockstep
from appo.hooks import CheckpointSaved, EpisodeEnd, Evaluation, Hooks, LearnerIteration
from appo.learning.checkpoint import newest_checkpoints
from appo.memory.buffers import Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.memory.segments import remove_orphan_segments, unlink_segment, weights_segment_name
from appo.population import pbt
from appo.population.matchmaking import num_acting_ids
from appo.population.ratings import Ratings
from appo.run.supervisor import Supervisor
from appo.sampling.sampler_group import SamplerGroup
from envs import EnvInfo
from utils.logs import log
from utils.queues import make_queue

SHUTDOWN_SECONDS = 8.0


@dataclass
class Outcome:
    """Why the run stopped; `completed` runs get the `done` marker."""

    reason: str
    completed: bool
    failed: bool = False


class Runner:
    def __init__(self, cfg, env: EnvInfo, exp_dir: str, initial_env_steps: list[int], hooks: Hooks | None = None):
        from appo.run.reporting import Reports

        self.cfg, self.env, self.exp_dir = cfg, env, exp_dir
        self.spaces = (env.obs_space, env.action_space)
        self.layout = Layout.from_cfg(cfg, env.obs_space, env.action_space, env.num_agents)
        self.traj = TrajBuffers(self.layout)
        self.num_acting = num_acting_ids(cfg)  # policies and their self-play snapshots
        self.control = SharedControl(self.layout, cfg.num_policies,
                                    (len(inference_shards(cfg)), cfg.policy_workers_per_policy),
                                    tuple(env.reward_shaping), num_snapshots=self.num_acting - cfg.num_policies)
        self.run_token = f"{os.getpid()}_{secrets.token_hex(3)}"
        # 1 MB holds many seconds of reports (the runner drains it every 50 ms). A bigger ring only makes each
        # worker's resident memory creep up for longer: RSS counts the shared pages a process has touched, and a
        # ring's messages move through all of its pages (10 MB took 45 min with 4 CartPole actors).
        self.report_queue = make_queue(1_000_000)
        self.learner_inboxes = [make_queue() for _ in range(cfg.num_policies)]
        self.weights_names = [weights_segment_name(self.run_token, i) for i in range(self.num_acting)]
        if cfg.backend == "local":  # the sampler runs here, in these buffers
            self.group = SamplerGroup(cfg, self.layout, self.spaces, self.traj, self.control, self.learner_inboxes,
                                      self.report_queue, self.weights_names)
            self.actor_inboxes = self.group.actor_inboxes
        else:  # the nodes sample; the cluster process copies their trajectories into these slots (ray_backend.py)
            self.group = None
            self.cluster_inbox = make_queue()
            self.actor_inboxes = [self.cluster_inbox] * cfg.num_workers  # learners' "released" wake it
        # Evaluation requests; each policy is due again --eval_every_env_steps after its last request.
        self.eval_inbox = make_queue() if cfg.eval_every_env_steps else None
        self.next_eval = [steps + cfg.eval_every_env_steps for steps in initial_env_steps]
        self.hooks = hooks or Hooks()
        self.hook_failure: str | None = None
        self.reports = Reports(cfg, exp_dir, initial_env_steps, env.frames_per_step)
        # Who beats whom, when games have players of different acting ids (appo/population/ratings.py); kept across resume.
        self.ratings = Ratings.load(exp_dir) if env.num_agents > 1 and self.num_acting > 1 else None
        self.reports.ratings = self.ratings
        self.supervisor = Supervisor(self.report_queue, cfg.max_worker_restarts)
        self.population: list[pbt.Member] | None = None
        if cfg.with_pbt:
            self.pbt_settings = pbt.Settings.from_cfg(cfg, pbt.shaping_bounds(env.reward_shaping_bounds))
            self.pbt_rng = random.Random(cfg.seed)
            self.population = pbt.restore_population(exp_dir, cfg, env.reward_shaping,
                                                     self.pbt_settings.shaping_bounds, self.pbt_rng)
            self._publish_population()
        self.interrupted = False

    # ---------------------------------------------------------------- processes
    def _queues(self) -> list[tuple[str, object]]:
        """Every queue with a readable name (for the repair after a death, see utils/queues.py)."""
        named = [("report queue", self.report_queue)]
        named += [(f"learner_p{p} inbox", q) for p, q in enumerate(self.learner_inboxes)]
        if self.eval_inbox is not None:
            named.append(("evaluator inbox", self.eval_inbox))
        if self.group is not None:
            named += self.group.queues()
        else:
            named.append(("cluster inbox", self.cluster_inbox))
        return named

    def start(self) -> None:
        removed = remove_orphan_segments()
        if removed:
            log.info("Removed %d shared-memory segments left by runs whose main process died: %s", len(removed),
                     ", ".join(removed))
        cfg, layout, weights_names = self.cfg, self.layout, self.weights_names
        # Each worker: how to start it (arguments taken at every start) and which flags in shared memory its
        # death may leave raised.
        add, control = self.supervisor.add, self.control
        for p in range(cfg.num_policies):
            add(f"learner_p{p}", "appo.learning.learner", "run_learner", lambda p=p: (
                cfg, layout, self.spaces, p, self.traj, control, self.learner_inboxes, self.actor_inboxes,
                self.report_queue, weights_names, self.exp_dir,
                None if self.population is None else self.population[p].hyperparams,
                bool(self.hooks.on_learner_iteration)),
                cleanup=lambda p=p: control.learners.pause_collection.__setitem__(p, 0), inbox=self.learner_inboxes[p])
        if self.eval_inbox is not None:
            add("evaluator", "appo.learning.evaluator", "run_evaluator", lambda: (
                cfg, self.spaces, self.env.num_agents, control, self.eval_inbox, self.report_queue, weights_names,
                self.exp_dir), cleanup=lambda: None, inbox=self.eval_inbox)
        if self.group is not None:
            self.group.start(self.supervisor)
        else:
            add("cluster", "appo.run.ray_backend", "run_cluster", lambda: (
                cfg, layout, self.env, self.traj, control, self.learner_inboxes, self.cluster_inbox,
                self.report_queue, weights_names), cleanup=lambda: None, inbox=self.cluster_inbox)

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
            reports.tick(self.control.learners.env_steps)
            now = time.monotonic()
            outcome = self._check_stop(now - start)
            if outcome is not None:
                return outcome
            if self.population is not None:
                self._pbt_step()
            if self.eval_inbox is not None:
                self._request_evaluations()
            if now - last_status >= cfg.report_interval:
                for line in reports.status_line().splitlines():  # one log line each: all fit 120 columns
                    log.info(line)
                last_status = now
            if now - last_summary >= cfg.experiment_summaries_interval:
                reports.write_summaries(self._memory_mb())
                if self.ratings is not None:
                    self.ratings.save(self.exp_dir)
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
                if self.ratings is not None:
                    for names, returns in message[2]["games"]:
                        self.ratings.record_game(names, returns)
                if self.hooks.on_episode_end:
                    for policy, reward, length, objective, extra in message[2]["episodes"]:
                        self._call_hooks("on_episode_end", EpisodeEnd(policy, reward, length, objective, extra,
                                                                      self.reports.env_steps[policy]))
            elif kind == "inference":
                self.reports.on_inference(message[1], message[2])
            elif kind == "learner":
                self.reports.on_learner(message[1], message[2])
            elif kind == "iteration":
                self._call_hooks("on_learner_iteration", LearnerIteration(message[1], **message[2]))
            elif kind == "checkpoint":
                self._call_hooks("on_checkpoint", CheckpointSaved(message[1], **message[2]))
            elif kind == "cluster":
                self.reports.on_cluster(message[1])
            elif kind == "evaluation":
                self.reports.on_evaluation(message[1], message[2])
                self._call_hooks("on_evaluation", Evaluation(message[1], **message[2]))
            elif kind == "ready":
                self.supervisor.on_ready(message[1])
            elif kind in ("error", "fatal"):
                self.supervisor.on_error(message[1], message[2], fatal=kind == "fatal")

    def _call_hooks(self, name: str, event: object) -> None:
        """Run the user's hooks for an event; the first one that raises stops the run (see appo/hooks.py)."""
        for hook in getattr(self.hooks, name):
            if self.hook_failure is not None:
                return
            try:
                hook(event)
            except Exception as exc:
                log.exception("The %s hook %s raised", name, getattr(hook, "__qualname__", hook))
                self.hook_failure = (f"the {name} hook {getattr(hook, '__qualname__', hook)} raised "
                                     f"{type(exc).__name__}: {exc}")

    def _request_evaluations(self) -> None:
        """Ask the evaluator for every policy that took --eval_every_env_steps since it was last asked."""
        for p, steps in enumerate(self.reports.env_steps):
            if steps >= self.next_eval[p]:
                with contextlib.suppress(Full):
                    self.eval_inbox.put_nowait(("evaluate", p))
                self.next_eval[p] = steps + self.cfg.eval_every_env_steps

    # ---------------------------------------------------------------- supervision
    def _supervise(self) -> Outcome | None:
        """Replace every worker that died or hangs; an Outcome when the run cannot go on."""
        if self.group is not None:
            self.group.kill_hung_actors(self.supervisor)
        reason = self.supervisor.replace_dead(self._queues(), lambda: self._drain_reports(timeout=0.0))
        self.reports.restarts = self.supervisor.restart_counts()
        return None if reason is None else Outcome(reason, completed=False, failed=True)

    def _blocked_in(self) -> str:
        """What every worker is doing, for the stall report: actors' current env call, the others' last report."""
        now = time.monotonic()
        states = {name: f"{state} (reported {now - when:.0f} s ago)"
                  for name, (state, when) in self.reports.states.items()}
        if self.group is not None:
            states.update(self.group.env_calls())
        return "; ".join(f"{name}: {state}" for name, state in sorted(states.items()))

    def _check_stop(self, elapsed: float) -> Outcome | None:
        cfg, reports = self.cfg, self.reports
        outcome = self._supervise()
        if outcome is not None:
            return outcome
        late = self.supervisor.not_ready_after("actor", cfg.reset_timeout_seconds)
        if late:
            return Outcome(f"{', '.join(late)} did not create and reset its envs within --reset_timeout_seconds="
                           f"{cfg.reset_timeout_seconds:g} of starting; states: {self._blocked_in()}",
                           completed=False, failed=True)
        if self.supervisor.not_ready_after("cluster", cfg.reset_timeout_seconds):
            return Outcome(f"the Ray cluster ran no sampler group within --reset_timeout_seconds="
                           f"{cfg.reset_timeout_seconds:g} (is --ray_address={cfg.ray_address!r} right, and does a "
                           f"node have the CPUs a group asks for?); states: {self._blocked_in()}",
                           completed=False, failed=True)
        if self.interrupted:
            return Outcome("interrupted", completed=False)
        if self.hook_failure is not None:
            return Outcome(self.hook_failure, completed=False, failed=True)
        all_ready_at = self.supervisor.all_ready_at()  # start-up (torch imports, env creation) is not a stall
        stalled = time.monotonic() - max(reports.last_progress, all_ready_at or 0.0)
        if all_ready_at is not None and stalled > cfg.stall_timeout_seconds:
            return Outcome(f"no env step for {stalled:.0f} s (--stall_timeout_seconds); worker states: "
                           f"{self._blocked_in()}", completed=False, failed=True)
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
                return Outcome(  # one line (scripts/time_to_solve.py reads it) within 120 columns
                    f"target {measure} {target:g} reached by p{solved[0]} (mean {solved[1]:.2f} of {cfg.stats_avg}) "
                    f"at {launched:.1f} s, {reports.total_env_steps()} env steps", completed=True)
        return None

    # ---------------------------------------------------------------- population-based training
    def _pbt_step(self) -> None:
        """Judge the policies whose period is up and carry out the decisions (see appo/population/pbt.py)."""
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
        keys = self.control.runner.shaping_keys
        for p, member in enumerate(self.population):
            self.control.runner.reward_shaping[p, :len(keys)] = [member.shaping[key] for key in keys]
        self.reports.hyperparams = [
            {**member.hyperparams, **{f"shaping_{key}": value for key, value in member.shaping.items()}}
            for member in self.population]

    def _memory_mb(self) -> dict[str, float]:
        memory = {"runner": psutil.Process().memory_info().rss / 2**20}
        for process in self.supervisor.processes():
            with contextlib.suppress(psutil.NoSuchProcess, ValueError):
                memory[process.name] = psutil.Process(process.pid).memory_info().rss / 2**20
        return memory

    # ---------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Stop everyone (learners save a checkpoint), join with a deadline, free shared memory."""
        self.control.runner.stop[0] = 1
        self.supervisor.join_all(time.monotonic() + SHUTDOWN_SECONDS, lambda: self._drain_reports(timeout=0.0))
        self._drain_reports(timeout=0.0)
        for i in range(self.num_acting):
            unlink_segment(weights_segment_name(self.run_token, i))
        self.reports.write_summaries({})
        if self.ratings is not None:
            self.ratings.save(self.exp_dir)
        self.reports.close()

    def write_benchmark(self) -> None:
        """Print the benchmark table and save it as benchmark.json (atomically)."""
        from appo.run.reporting import format_benchmark

        summary = self.reports.benchmark_summary(self.cfg.env)
        log.info("\n%s", format_benchmark(summary))
        path = os.path.join(self.exp_dir, "benchmark.json")
        with open(f"{path}.tmp", "w") as f:
            json.dump(summary, f, indent=2)
        os.replace(f"{path}.tmp", path)

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
