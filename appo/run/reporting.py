"""Aggregation of worker reports in the runner: FPS windows, episode statistics, learner statistics.

Workers send small dicts (see `actor_worker._report`, `inference_worker._report`, `learner._report`);
this module turns them into the printed status line and the per-policy tensorboard summaries.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict, deque

import numpy as np
import psutil

from appo.config.cfg import NO_BUDGET
from appo.config.topology import inference_shards

FPS_WINDOWS = (10, 60, 300)
# Printed lines fit 120 columns with the log prefix "[HH:MM:SS][MainProcess] " (24 characters).
LINE_WIDTH = 96
# --train_for_env_steps and --train_for_seconds default to 1e10: that means no budget, not a 300-year ETA.
# An ETA beyond this is shown as unknown ("ETA -").
MAX_ETA_S = 100 * 86400


# What each component's timing keys mean, in the order the benchmark table shows them.
TIME_SHARES = {
    "actor": {"env_step": "env step", "wait_actions": "waiting for actions", "wait_buffers": "waiting for buffers"},
    "inference": {"forward": "forward", "weights": "weight updates", "wait": "waiting"},
    "learner": {"batching": "batching", "sgd": "SGD", "wait": "waiting"},
}


class Reports:
    def __init__(self, cfg, exp_dir: str, initial_env_steps: list[int], frames_per_step: int = 1):
        self.cfg = cfg
        self.num_policies = cfg.num_policies
        self.frames_per_step = frames_per_step
        self.start = time.monotonic()
        # Benchmarks measure the steady state: from the moment every actor worker has reported samples
        # (actors finish building and resetting their envs at different times).
        self.sampling_actors: set[int] = set()
        self.measure_start: tuple[float, int, int] | None = None  # (time, env steps, samples) at that moment
        self.cpu_at_measure_start = psutil.cpu_times()
        self.sampled_env_steps = 0  # this session, all policies, from actor reports
        self.frame_history: deque[tuple[float, int]] = deque([(self.start, 0)])
        self.episodes = [deque(maxlen=cfg.stats_avg) for _ in range(self.num_policies)]
        self.episodes_total = [0] * self.num_policies
        # Per-episode objective PBT ranks by (--pbt_target_objective); emptied when a policy's weights are replaced.
        self.objectives = [deque(maxlen=cfg.stats_avg) for _ in range(self.num_policies)]
        self.hyperparams: list[dict[str, float]] | None = None  # set by the runner in PBT runs
        self.ratings = None  # appo.population.ratings.Ratings, set by the runner when games have players of different ids
        self.show_objective = cfg.with_pbt or cfg.target_objective is not None
        # Per policy, each metric an env reports in info["episode_extra_stats"]: its last --stats_avg values.
        self.extra_stats: list[dict[str, deque]] = [{} for _ in range(self.num_policies)]
        # Per policy, the newest evaluation (appo/learning/evaluator.py): version, env_steps, results.
        self.evaluations: list[dict | None] = [None] * self.num_policies
        # Faults the run survived, since it started: env exceptions, non-finite rewards and observations (set to
        # 0), learner updates skipped for a non-finite loss or gradient, and worker restarts per role.
        self.env_errors = 0
        self.nonfinite_values = 0
        self.skipped_updates = [0] * self.num_policies
        self.restarts: dict[str, int] = {}  # set by the runner
        # --backend=ray: the cluster process's last report (per sampler group: node, env steps, bytes moved), and
        # its totals over the measured period of a benchmark: seconds, busy seconds, trajectory and weights bytes.
        self.cluster: dict | None = None
        self.cluster_totals = {"seconds": 0.0, "busy": 0.0, "traj_bytes": 0, "weights_bytes": 0}
        self.env_steps = list(initial_env_steps)  # trained + dropped env steps per policy (learner count)
        self.versions = [0] * self.num_policies
        self.dropped = [0] * self.num_policies
        self.learner_stats: list[dict[str, float]] = [{} for _ in range(self.num_policies)]
        self.sample_history = [deque([(self.start, 0)]) for _ in range(self.num_policies)]
        # Total env steps over time (kept by tick()), for the ETA of a step budget.
        self.env_step_history: deque[tuple[float, int]] = deque([(self.start, sum(initial_env_steps))])
        # Each policy's best full-window mean reward, and the episode count it was last checked at.
        self.best_rewards: list[float | None] = [None] * self.num_policies
        self._best_checked_at = [0] * self.num_policies
        self.samples_total = [0] * self.num_policies
        self.inference_obs = self.inference_batches = 0  # for the mean inference batch size
        self.timing: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.lag = {"min": float("inf"), "max": 0.0, "avg_sum": 0.0, "reports": 0}
        self.device = "?"
        self.states: dict[str, tuple[str, float]] = {}  # last reported state of each worker and when, for stall reports
        self.last_progress = self.start  # when env steps last moved
        self.exp_dir = exp_dir
        self._writers: list | None = None

    @property
    def writers(self) -> list:
        """Tensorboard writers, one per policy, made on first use: the runner builds Reports before it forks the
        workers, and tensorboardX imports torch, which actor workers must not inherit."""
        if self._writers is None:
            from tensorboardX import SummaryWriter

            self._writers = [SummaryWriter(os.path.join(self.exp_dir, "summaries", str(p)), flush_secs=10)
                             for p in range(self.num_policies)]
        return self._writers

    # ---------------------------------------------------------------- intake
    def on_actor(self, worker: int, data: dict) -> None:
        self.states[f"actor_{worker}"] = (data["state"], time.monotonic())
        self._add_timing("actor", data["timing"])
        if data["env_steps"] > 0:
            self.last_progress = time.monotonic()
        if self.measure_start is None and data["env_steps"] > 0:
            self.sampling_actors.add(worker)
            if len(self.sampling_actors) == self.cfg.num_workers:
                # This report's steps were taken before now: they are not part of the measured period.
                self.measure_start = (time.monotonic(), self.sampled_env_steps + data["env_steps"],
                                      sum(self.samples_total))
                self.cpu_at_measure_start = psutil.cpu_times()
                self.inference_obs = self.inference_batches = 0
        self.sampled_env_steps += data["env_steps"]
        self.env_errors += data["env_errors"]
        self.nonfinite_values += data["nonfinite"]
        for policy, reward, length, objective, extra in data["episodes"]:
            self.episodes[policy].append((reward, length))
            self.episodes_total[policy] += 1
            if objective is not None:
                self.objectives[policy].append(objective)
            for name, value in extra.items():
                self.extra_stats[policy].setdefault(name, deque(maxlen=self.cfg.stats_avg)).append(value)

    def on_cluster(self, data: dict) -> None:
        self.cluster = data
        if self.measure_start is not None:
            totals = self.cluster_totals
            totals["seconds"] += data["seconds"]
            totals["busy"] += data["busy"]
            totals["traj_bytes"] += sum(group["traj_bytes"] for group in data["groups"])
            totals["weights_bytes"] += sum(group["weights_bytes"] for group in data["groups"])

    def restart_counts(self) -> dict[str, int]:
        """Worker restarts per role on this machine and on the cluster's nodes, and replaced sampler groups."""
        counts = dict(self.restarts)
        for group in (self.cluster or {}).get("groups", []):
            for role, n in group["restarts"].items():
                counts[role] = counts.get(role, 0) + n
            counts["sampler group"] = counts.get("sampler group", 0) + group["replacements"]
        return counts

    def cluster_text(self) -> str:
        """Per sampler group: its node and FPS (or why it is not running); then the head's bytes/s in and out."""
        data = self.cluster
        seconds = max(data["seconds"], 1e-9)
        pieces = []
        for group in data["groups"]:
            if group["running"]:
                state = f"{_si(group['env_steps'] / seconds)} FPS"
            else:
                state = f"lost ({group['lost'][:60]}), waiting for CPUs" if group["lost"] else "starting"
            pieces.append(f"{group['name']} {group['node'] or '-'} {state}")
        traj = sum(group["traj_bytes"] for group in data["groups"]) / seconds
        weights = sum(group["weights_bytes"] for group in data["groups"]) / seconds
        return (f"cluster: {'; '.join(pieces)}; trajectories in {_si(traj)}B/s, weights out {_si(weights)}B/s, "
                f"head busy {data['busy'] / seconds:.0%}")

    def on_evaluation(self, policy: int, data: dict) -> None:
        """Keep the newest evaluation for the status line and write all its results under eval/."""
        self.evaluations[policy] = data
        for name, value in data["results"].items():
            self.writers[policy].add_scalar(f"eval/{name}", value, data["env_steps"])

    def on_inference(self, name: str, data: dict) -> None:
        self.states[name] = (data["state"], time.monotonic())
        self.inference_obs += data["samples"]
        self.inference_batches += data["batches"]
        self.nonfinite_values += data["nonfinite"]
        self._add_timing("inference", data["timing"])

    def on_learner(self, policy: int, data: dict) -> None:
        self.states[f"learner_p{policy}"] = (data["state"], time.monotonic())
        self.env_steps[policy] = data["env_steps"]
        self.versions[policy] = data["version"]
        self.dropped[policy] += data["dropped"]
        self.skipped_updates[policy] += data["skipped_updates"]
        self.nonfinite_values += data["nonfinite_inputs"]
        self.samples_total[policy] += data["samples"]
        self._append(self.sample_history[policy], self.samples_total[policy])
        stats = data["stats"]
        self.learner_stats[policy].update(stats)
        if "lag_avg" in stats:
            self.lag["min"] = min(self.lag["min"], stats["lag_min"])
            self.lag["max"] = max(self.lag["max"], stats["lag_max"])
            self.lag["avg_sum"] += stats["lag_avg"]
            self.lag["reports"] += 1
        self.device = data["device"]
        self._add_timing("learner", data["timing"])

    def _add_timing(self, component: str, timing: dict[str, float]) -> None:
        """Time shares describe the steady state: periods reported before every actor sampled are left out."""
        if self.measure_start is None:
            return
        for key, seconds in timing.items():
            self.timing[component][key] += seconds

    # ---------------------------------------------------------------- derived numbers
    def tick(self, learner_env_steps: np.ndarray | None = None) -> None:
        """Called every runner loop; `learner_env_steps` (SharedControl.learner_env_steps, which learners set
        after every iteration) keeps the env-step counts current between the learners' reports."""
        self._append(self.frame_history, self.sampled_env_steps)
        if learner_env_steps is not None:
            self.env_steps = [max(ours, int(theirs)) for ours, theirs in zip(self.env_steps, learner_env_steps)]
        self._append(self.env_step_history, self.total_env_steps())
        self._track_best_rewards()

    def _track_best_rewards(self) -> None:
        """Each policy's best mean reward over a full --stats_avg window so far; recomputed only when episodes
        came in since the last check."""
        for p in range(self.num_policies):
            if self.episodes_total[p] == self._best_checked_at[p]:
                continue
            self._best_checked_at[p] = self.episodes_total[p]
            mean = self.full_window_mean(p, "reward")
            if mean is not None and (self.best_rewards[p] is None or mean > self.best_rewards[p]):
                self.best_rewards[p] = mean

    def env_step_rate(self, window: float = 60.0) -> float:
        """Env steps per second (the count the budget is in: all policies' learners) over the last window."""
        return self._rate(self.env_step_history, window)

    def progress(self) -> tuple[float, str, float | None] | None:
        """How far the run is toward the budget closest to done: (fraction done, that budget in words, seconds
        left or None when unknown); None when no budget is set. Step budgets estimate the time left from the
        env-step rate of the last minute; --train_for_seconds counts this session, as the runner does."""
        cfg, budgets = self.cfg, []
        elapsed = time.monotonic() - self.start

        def steps_budget(done: float, budget: float, rate: float, what: str) -> None:
            eta = max(budget - done, 0) / rate if rate > 0 else None
            budgets.append((done / budget, f"{_si(budget, trim=True)} {what}", eta))

        if cfg.train_for_env_steps < NO_BUDGET:
            steps_budget(self.total_env_steps(), cfg.train_for_env_steps, self.env_step_rate(), "steps")
        if cfg.train_for_seconds < NO_BUDGET:
            budgets.append((elapsed / cfg.train_for_seconds, _duration(cfg.train_for_seconds),
                            max(cfg.train_for_seconds - elapsed, 0.0)))
        if cfg.benchmark:  # counted from the moment every actor samples, as the runner does
            _, env_steps, samples = self.measured()
            steps_budget(env_steps, cfg.benchmark_env_steps, self._rate(self.frame_history, 60), "benchmark steps")
            if not cfg.sampler_only:
                steps_budget(samples, cfg.benchmark_samples,
                             sum(self.sample_throughput(p, 60) for p in range(self.num_policies)), "benchmark samples")
        if not budgets:
            return None
        fraction, budget, eta = max(budgets, key=lambda b: b[0])
        return min(fraction, 1.0), budget, eta if eta is not None and eta <= MAX_ETA_S else None

    @staticmethod
    def _append(history: deque, count: int) -> None:
        """Add (now, count) and forget what is older than the longest rate window, so a long run's histories
        (and the rates computed over them) stay the same size."""
        now = time.monotonic()
        history.append((now, count))
        while history[0][0] < now - max(FPS_WINDOWS) - 5:
            history.popleft()

    @staticmethod
    def _rate(history: deque, window: float) -> float:
        now, latest = history[-1]
        for t, count in history:
            if t >= now - window:
                return (latest - count) / (now - t) if now > t else 0.0
        return 0.0

    def fps(self, window: float) -> float:
        """Env frames per second (env steps times the env's frame skip)."""
        return self._rate(self.frame_history, window) * self.frames_per_step

    def sample_throughput(self, policy: int, window: float = 10.0) -> float:
        return self._rate(self.sample_history[policy], window)

    def mean_episode(self, policy: int) -> tuple[float, float] | None:
        if not self.episodes[policy]:
            return None
        rewards, lengths = zip(*self.episodes[policy])
        return float(np.mean(rewards)), float(np.mean(lengths))

    def full_window_mean(self, policy: int, measure: str) -> float | None:
        """Mean episode "reward" or "objective" over the last --stats_avg episodes; None until there are that many."""
        values = self.objectives[policy] if measure == "objective" else [r for r, _ in self.episodes[policy]]
        return float(np.mean(values)) if len(values) == self.cfg.stats_avg else None

    def objective(self, policy: int) -> float | None:
        """What PBT ranks the policy by."""
        return self.full_window_mean(policy, "objective")

    def forget_objective(self, policy: int) -> None:
        """After a policy's weights were replaced it is judged on episodes of its new weights only."""
        self.objectives[policy].clear()

    def solved_policy(self, target: float, measure: str = "reward") -> tuple[int, float] | None:
        """A policy whose full-window mean reward (or objective) reaches target, with that mean."""
        for policy in range(self.num_policies):
            mean = self.full_window_mean(policy, measure)
            if mean is not None and mean >= target:
                return policy, mean
        return None

    def final_stats(self) -> dict[int, dict[str, float]]:
        """Per policy with finished episodes: the mean reward and length over the last --stats_avg episodes, the
        number of episodes that mean is over and, when the env reports one, the mean objective."""
        stats = {}
        for policy in range(self.num_policies):
            episode = self.mean_episode(policy)
            if episode is None:
                continue
            stats[policy] = {"reward": episode[0], "length": episode[1], "episodes": len(self.episodes[policy])}
            if self.objectives[policy]:
                stats[policy]["objective"] = float(np.mean(self.objectives[policy]))
            for name, values in self.extra_stats[policy].items():  # the trainer's own names win
                stats[policy].setdefault(name, float(np.mean(values)))
        return stats

    def total_env_steps(self) -> int:
        return sum(self.env_steps)

    # ---------------------------------------------------------------- output
    def status_line(self) -> str:
        """The status, one line each for: progress (percent of the budget, elapsed time, ETA, env steps, FPS over
        10 s, 60 s and 300 s), every policy, the faults survived (when any) and the PBT population; every line
        at most LINE_WIDTH characters (a long one goes on, indented, on the next)."""
        self._track_best_rewards()
        elapsed = _duration(time.monotonic() - self.start)
        progress = self.progress()
        if progress is None:
            head = f"no budget, {elapsed} elapsed, ETA -"
        else:
            fraction, budget, eta = progress
            head = f"{fraction:.1%} of {budget} in {elapsed}, ETA {'-' if eta is None else _duration(eta)}"
        fps = "/".join(_si(self.fps(w)) for w in FPS_WINDOWS)
        windows = "/".join(f"{w}s" for w in FPS_WINDOWS)
        lines = _fit([head, f" | env steps {self.total_env_steps()}", f" | FPS {windows} {fps}"])
        for p in range(self.num_policies):
            stats = self.learner_stats[p]
            episode = self.mean_episode(p)
            pieces = [f"p{p}: v{self.versions[p]}"]
            if episode is not None:
                pieces[0] += f", reward {episode[0]:.2f} length {episode[1]:.1f}"
                pieces.append(f" ({len(self.episodes[p])} of {self.episodes_total[p]} episodes)")
            else:
                pieces.append(", no finished episode yet")
            if self.show_objective and self.objectives[p]:
                pieces.append(f", objective {np.mean(self.objectives[p]):.3f}")
            pieces.append(f", {_si(self.sample_throughput(p))} samples/s")
            if "lag_avg" in stats:
                pieces.append(f", lag {stats['lag_min']:.0f}/{stats['lag_avg']:.1f}/{stats['lag_max']:.0f}")
            evaluation = self.evaluations[p]
            if evaluation is not None:
                results = evaluation["results"]
                pieces.append(f", eval {results['reward']:.2f} ± {results['reward_std']:.2f} "
                              f"at {_si(evaluation['env_steps'])} steps")
            lines += _fit(pieces, indent="  ")
        faults = []
        if self.env_errors:
            faults.append(f"env errors {self.env_errors} (episodes lost, envs rebuilt)")
        if self.nonfinite_values:
            faults.append(f"non-finite values {self.nonfinite_values} (set to 0)")
        if any(self.skipped_updates):
            faults.append(f"updates skipped (non-finite) {sum(self.skipped_updates)}")
        restarts = ", ".join(f"{role} {n}" for role, n in sorted(self.restart_counts().items()) if n)
        if restarts:
            faults.append(f"restarts: {restarts}")
        if faults:
            lines += _fit([f"faults: {faults[0]}"] + [f", {fault}" for fault in faults[1:]], indent="  ")
        if self.cluster is not None:
            pieces = self.cluster_text().split(";")
            lines += _fit([f"{piece};" for piece in pieces[:-1]] + pieces[-1:], indent="  ")
        if self.hyperparams is not None:
            lines += _fit([self._population_text()], indent="  ")
        if self.ratings is not None:
            for parts in self.ratings.status_pieces(self.num_policies):  # a line (or two) per policy
                lines += _fit([f"ratings: {parts[0]}", *parts[1:]], indent="  ")
        return "\n".join(lines)

    def summary_line(self, checkpoints: list[str | None]) -> str:
        """The run at its end: time, env steps, and per policy the final mean reward (last --stats_avg episodes),
        the best full-window mean reward of this session and the newest checkpoint; one line each."""
        self._track_best_rewards()
        seconds = time.monotonic() - self.start
        took = f"{seconds:.1f} s" + (f" ({_duration(seconds)})" if seconds >= 60 else "")
        lines = [f"Summary: {took}, {self.total_env_steps()} env steps"]
        stats = self.final_stats()
        for p in range(self.num_policies):
            if p in stats:
                best = self.best_rewards[p]
                lines += _fit([f"p{p}: final reward {stats[p]['reward']:.2f}",
                               f" (best {'-' if best is None else f'{best:.2f}'})",
                               f" over {stats[p]['episodes']} episodes"], indent="  ")
            else:
                lines.append(f"  p{p}: no finished episode")
            # The one line that may pass LINE_WIDTH: only by the length of the checkpoint's path, left whole.
            lines.append(f"  p{p} checkpoint: {checkpoints[p] or 'none'}")
        return "\n".join(lines)

    def _population_text(self) -> str:
        """The population's best and worst objective, over whatever episodes each policy has so far."""
        means = {p: float(np.mean(w)) for p, w in enumerate(self.objectives) if w}
        if not means:
            return "PBT objective: no episodes yet"
        best, worst = max(means, key=means.get), min(means, key=means.get)
        return f"PBT objective best {means[best]:.3f} (p{best}) worst {means[worst]:.3f} (p{worst})"

    def write_summaries(self, memory_mb: dict[str, float]) -> None:
        for p, writer in enumerate(self.writers):
            step = self.env_steps[p]
            writer.add_scalar("perf/fps_10s", self.fps(10), step)
            writer.add_scalar("perf/fps_60s", self.fps(60), step)
            writer.add_scalar("perf/samples_per_s", self.sample_throughput(p), step)
            writer.add_scalar("perf/policy_version", self.versions[p], step)
            writer.add_scalar("perf/dropped_trajectories", self.dropped[p], step)
            episode = self.mean_episode(p)
            if episode is not None:
                writer.add_scalar("episode/reward", episode[0], step)
                writer.add_scalar("episode/length", episode[1], step)
            for name, values in self.extra_stats[p].items():
                writer.add_scalar(f"episode_extra/{name}", float(np.mean(values)), step)
            for key, value in self.learner_stats[p].items():
                group = "lag" if key.startswith("lag") else "learner"
                writer.add_scalar(f"{group}/{key}", value, step)
            for name, mb in memory_mb.items():
                writer.add_scalar(f"memory/{name}_mb", mb, step)
            writer.add_scalar("faults/skipped_updates", self.skipped_updates[p], step)
            if p == 0:  # run-wide counts go with the first policy
                writer.add_scalar("faults/env_errors", self.env_errors, step)
                writer.add_scalar("faults/nonfinite_values", self.nonfinite_values, step)
                restarts = self.restart_counts()
                for role in ("actor", "inference", "learner"):
                    writer.add_scalar(f"faults/restarts_{role}", restarts.get(role, 0), step)
                if self.cluster is not None:
                    self._write_cluster_summaries(writer, step)
            if self.hyperparams is not None:
                self.write_pbt_summaries(p)
            if self.ratings is not None:
                self.write_rating_summaries(p)

    def _write_cluster_summaries(self, writer, step: int) -> None:
        data = self.cluster
        seconds = max(data["seconds"], 1e-9)
        for group in data["groups"]:
            writer.add_scalar(f"cluster/{group['name']}_fps", group["env_steps"] / seconds, step)
        writer.add_scalar("cluster/trajectory_bytes_per_s", sum(g["traj_bytes"] for g in data["groups"]) / seconds,
                          step)
        writer.add_scalar("cluster/weights_bytes_per_s", sum(g["weights_bytes"] for g in data["groups"]) / seconds,
                          step)
        writer.add_scalar("cluster/head_busy", data["busy"] / seconds, step)
        writer.add_scalar("faults/sampler_groups_replaced", self.restart_counts().get("sampler group", 0), step)

    def write_rating_summaries(self, policy: int) -> None:
        """The policy's Elo and its win/draw/loss rates against snapshots and other policies, under selfplay/; the
        whole table of pairs as text."""
        writer, step, name, ratings = self.writers[policy], self.env_steps[policy], f"p{policy}", self.ratings
        if name not in ratings.elo:
            return
        writer.add_scalar("selfplay/elo", ratings.elo[name], step)
        for label, snapshots in (("snapshots", True), ("policies", False)):
            record = ratings.against(name, snapshots)
            if record.games:
                for outcome, rate in zip(("win", "draw", "loss"), record.rates()):
                    writer.add_scalar(f"selfplay/{outcome}_rate_vs_{label}", rate, step)
        if policy == 0:
            writer.add_text("selfplay/table", "\n\n".join(ratings.table()), step)

    def write_pbt_summaries(self, policy: int) -> None:
        """The policy's current hyper-parameters and objective, under pbt/."""
        writer, step = self.writers[policy], self.env_steps[policy]
        for name, value in self.hyperparams[policy].items():
            writer.add_scalar(f"pbt/{name}", value, step)
        if self.objectives[policy]:
            writer.add_scalar("pbt/objective", float(np.mean(self.objectives[policy])), step)

    # ---------------------------------------------------------------- benchmark
    def measured(self) -> tuple[float, int, int]:
        """Seconds, env steps and trained samples of the measured period (every actor sampling)."""
        if self.measure_start is None:
            return 0.0, 0, 0
        begin, steps_before, samples_before = self.measure_start
        return time.monotonic() - begin, self.sampled_env_steps - steps_before, sum(self.samples_total) - samples_before

    def benchmark_summary(self, env_name: str) -> dict:
        """Throughput, and where each component's time went, since every actor worker is sampling."""
        cfg = self.cfg
        wall = time.monotonic() - self.start
        seconds, env_steps, samples = self.measured()
        measured = max(seconds, 1e-9)
        processes = {"actor": cfg.num_workers, "inference": len(inference_shards(cfg)) * cfg.policy_workers_per_policy,
                     "learner": cfg.num_policies}
        shares = {}
        for component, keys in TIME_SHARES.items():
            total = max(self.timing[component].get("elapsed", 0.0), 1e-9)  # summed over the component's processes
            shares[component] = {key: self.timing[component].get(key, 0.0) / total for key in keys}
            shares[component]["other"] = max(0.0, 1.0 - sum(shares[component].values()))
        summary = {
            "env": env_name, "num_workers": cfg.num_workers, "num_envs_per_worker": cfg.num_envs_per_worker,
            "worker_num_splits": cfg.worker_num_splits, "num_policies": cfg.num_policies,
            "sampler_only": cfg.sampler_only, "device": self.device, "cpu_count": os.cpu_count(),
            "actor_niceness": cfg.actor_niceness, "actor_sched_batch": cfg.actor_sched_batch,
            "processes": sum(processes.values()) + 1,  # + runner
            "wall_seconds": wall, "measured_seconds": measured,
            "env_steps": env_steps, "env_frames": env_steps * self.frames_per_step,
            "env_steps_per_s": env_steps / measured,
            "env_frames_per_s": env_steps * self.frames_per_step / measured,
            "samples_per_s": samples / measured,
            "policy_lag": {"min": self.lag["min"] if self.lag["reports"] else 0.0, "max": self.lag["max"],
                           "avg": self.lag["avg_sum"] / self.lag["reports"] if self.lag["reports"] else 0.0},
            "time_shares": shares,
            "inference_batch_size": self.inference_obs / max(self.inference_batches, 1),
            "cpu_busy": _cpu_busy(self.cpu_at_measure_start, psutil.cpu_times()),
        }
        if self.cluster is not None:  # --backend=ray: what the head's cluster process moved
            totals = self.cluster_totals
            cluster_seconds = max(totals["seconds"], 1e-9)
            summary["cluster"] = {"groups": len(self.cluster["groups"]),
                                  "trajectory_bytes_per_s": totals["traj_bytes"] / cluster_seconds,
                                  "weights_bytes_per_s": totals["weights_bytes"] / cluster_seconds,
                                  "head_busy": totals["busy"] / cluster_seconds}
        summary["bottleneck"] = diagnose(summary)
        return summary

    def close(self) -> None:
        for writer in self._writers or []:
            writer.close()


def _si(value: float, trim: bool = False) -> str:
    """A count in at most 5 characters, 3 significant digits: 950, 41.2k, 33.0k, 412k, 1.23M (trim: 33k, 1M)."""
    if abs(value) < 999.5:
        return f"{value:.0f}"
    for unit in "kMGT":
        value /= 1000
        if abs(value) < 999.5 or unit == "T":
            break
    if trim:
        return f"{value:.3g}{unit}"
    decimals = next(d for d in (2, 1, 0) if abs(round(value, d)) < 10 ** (3 - d) or d == 0)
    return f"{value:.{decimals}f}{unit}"


def _duration(seconds: float) -> str:
    """Seconds in at most 6 characters: 42s, 3m12s, 2h05m, 3d04h."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _fit(pieces: list[str], indent: str = "", more: str = "    ") -> list[str]:
    """Join pieces (each after the first starts with its separator, e.g. ", lag 0/1.2/3") into lines of at most
    LINE_WIDTH characters: a piece that does not fit starts a new line, indented further, without its separator."""
    lines = [indent + pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + len(piece) <= LINE_WIDTH:
            lines[-1] += piece
        else:
            lines.append(indent + more + piece.lstrip(" ,|"))
    return lines


def _cpu_busy(before, after) -> float:
    """Fraction of all cores' time spent busy between two psutil.cpu_times() readings."""
    total = sum(after) - sum(before)
    idle = (after.idle - before.idle) + (getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0))
    return 1.0 - idle / total if total > 0 else 0.0


def diagnose(summary: dict) -> str:
    """One line naming the component that limits throughput and the flag that would move it."""
    actor, inference, learner = (summary["time_shares"][c] for c in ("actor", "inference", "learner"))
    processes = summary["processes"]
    cpu = summary["cpu_busy"]
    saturated = cpu > 0.9
    busy = {"actors": actor["env_step"], "inference": inference["forward"],
            "learner": 0.0 if summary["sampler_only"] else learner["sgd"] + learner["batching"]}
    cluster = summary.get("cluster")
    if cluster is not None and cluster["head_busy"] > 0.8:
        return (f"network: the head's cluster process is busy {cluster['head_busy']:.0%} of its time taking in "
                f"{_si(cluster['trajectory_bytes_per_s'])}B/s of trajectories and sending "
                f"{_si(cluster['weights_bytes_per_s'])}B/s of weights; a longer --rollout (fewer, larger transfers) "
                "or a faster link between the nodes")
    if actor["wait_buffers"] > 0.25 and not summary["sampler_only"]:
        return (f"learner: actors wait {actor['wait_buffers']:.0%} of their time for trajectory slots while the "
                f"learner is busy {busy['learner']:.0%}; lower --ppo_epochs or --num_batches_per_iteration, raise "
                "--learner_torch_threads if cores are free, or use --device=cuda")
    if busy["inference"] >= max(busy.values()) and busy["inference"] > 0.6:
        remedy = "add --policy_workers_per_policy or use --device=cuda"
        if saturated:
            remedy = ("fewer, larger requests (--num_envs_per_worker) or --device=cuda; more inference workers "
                      "cannot help on saturated cores")
            if summary["actor_niceness"] == 0 and actor["wait_actions"] > 0.2:
                remedy = "--actor_niceness=10 so inference preempts the actors on saturated cores, or " + remedy
        return (f"inference: busy {busy['inference']:.0%} while actors wait {actor['wait_actions']:.0%} for actions; "
                f"{remedy}")
    if busy["learner"] >= max(busy.values()) and busy["learner"] > 0.6:
        return (f"learner: busy {busy['learner']:.0%} of its time; lower --ppo_epochs or --num_batches_per_iteration, "
                "raise --learner_torch_threads if cores are free, or use --device=cuda")
    if actor["wait_actions"] > actor["env_step"]:
        if saturated and summary["actor_niceness"] == 0:
            return (f"CPU: {processes} processes keep {summary['cpu_count']} cores {cpu:.0%} busy and actors wait "
                    f"{actor['wait_actions']:.0%} for actions; --actor_niceness=10 lets inference run first")
        if saturated:
            return (f"CPU: {processes} processes keep {summary['cpu_count']} cores {cpu:.0%} busy, actors wait "
                    f"{actor['wait_actions']:.0%} for actions; raise --num_envs_per_worker (bigger batches, fewer "
                    "messages) rather than --num_workers")
        return (f"round trips: actors wait {actor['wait_actions']:.0%} for actions while inference is busy only "
                f"{inference['forward']:.0%}; raise --num_envs_per_worker or --worker_num_splits")
    more = "raise --num_workers" if not saturated else f"a faster env or more cores (cores {cpu:.0%} busy)"
    return f"env stepping: actors spend {actor['env_step']:.0%} of their time in env.step; {more}"


def format_benchmark(summary: dict) -> str:
    lag = summary["policy_lag"]
    lines = [
        f"Benchmark: {summary['env']}, {summary['num_workers']} workers x {summary['num_envs_per_worker']} envs"
        f"{', sampler only' if summary['sampler_only'] else ''}, {summary['cpu_count']} CPUs, "
        f"device {summary['device']}",
        f"  env frames/s   {summary['env_frames_per_s']:12,.0f}   ({summary['env_steps']:,} env steps in "
        f"{summary['measured_seconds']:.1f} s once all actors sample; {summary['wall_seconds']:.1f} s wall)",
        f"  samples/s      {summary['samples_per_s']:12,.0f}   (trained)",
        f"  policy lag     {lag['min']:.0f} / {lag['avg']:.1f} / {lag['max']:.0f} (min / avg / max versions)",
        f"  CPU busy       {summary['cpu_busy']:12.0%}   (all {summary['cpu_count']} cores, measured period)",
    ]
    for component, keys in TIME_SHARES.items():
        shares = summary["time_shares"][component]
        cells = [f"{label} {shares[key]:4.0%}" for key, label in keys.items()] + [f"other {shares['other']:4.0%}"]
        if component == "inference":
            cells.append(f"{summary['inference_batch_size']:.1f} obs per batch")
        lines.append(f"  {component:10s} " + " | ".join(cells))
    if "cluster" in summary:
        cluster = summary["cluster"]
        lines.append(f"  cluster        {cluster['groups']} sampler groups, trajectories in "
                     f"{_si(cluster['trajectory_bytes_per_s'])}B/s, weights out "
                     f"{_si(cluster['weights_bytes_per_s'])}B/s, head busy {cluster['head_busy']:.0%}")
    lines.append(f"  bottleneck: {summary['bottleneck']}")
    return "\n".join(lines)
