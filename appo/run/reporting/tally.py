"""Intake: the workers' reports (appo/messages.py), summed per policy and per run, and the counts over time.

Nothing here formats or writes: numbers.py derives rates and means from a Tally, text.py prints them, summaries.py
writes them to tensorboard and benchmark.py sums up a benchmark.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from appo.config.views import RunnerConfig
from appo.messages import ActorReport, ClusterReport, EpisodeEnd, Evaluation, InferenceReport, LearnerReport
from appo.utils.resources import memory_limit_bytes

Clock = Callable[[], float]
RATE_WINDOWS = (10, 60, 300)  # seconds: the FPS windows of the status line


class CountHistory:
    """A count over time (env steps, samples) as (time, count) points, none older than the longest rate window
    (and 5 s), so that a long run's histories, and the rates computed over them, stay the same size."""

    def __init__(self, clock: Clock, start: float, count: int) -> None:
        self.clock = clock
        self.points: deque[tuple[float, int]] = deque([(start, count)])

    def add(self, count: int) -> None:
        now = self.clock()
        self.points.append((now, count))
        while self.points[0][0] < now - max(RATE_WINDOWS) - 5:
            self.points.popleft()

    def rate(self, window: float) -> float:
        """Count per second, from the oldest point at most `window` seconds before the newest to the newest."""
        now, latest = self.points[-1]
        for t, count in self.points:
            if t >= now - window:
                return (latest - count) / (now - t) if now > t else 0.0
        return 0.0


class EpisodeWindow:
    """One policy's last --stats_avg finished episodes: (reward, length) pairs, the objectives PBT ranks by (emptied
    when the policy's weights are replaced), each metric the env reports in info["episode_extra_stats"]; and the
    number of episodes that ended in all."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.recent: deque[tuple[float, int]] = deque(maxlen=size)  # (reward, length)
        self.objectives: deque[float] = deque(maxlen=size)
        self.extra: dict[str, deque[float]] = {}
        self.total = 0

    def add(self, episode: EpisodeEnd) -> None:
        self.recent.append((episode.reward, episode.length))
        self.total += 1
        if episode.objective is not None:
            self.objectives.append(episode.objective)
        for name, value in episode.extra.items():
            self.extra.setdefault(name, deque(maxlen=self.size)).append(value)

    def forget_objectives(self) -> None:
        self.objectives.clear()


@dataclass
class PolicyTally:
    """One policy's numbers from its learner's reports (counts since this session started), its episodes from the
    actors' reports and its newest evaluation."""

    episodes: EpisodeWindow
    sample_history: CountHistory  # `samples` over time
    version: int = 0
    samples: int = 0  # trained
    dropped: int = 0  # trajectories dropped for lag
    skipped_updates: int = 0  # non-finite loss or gradient
    stats: dict[str, float] = field(default_factory=dict)  # the learner's newest: losses, lag, ...
    evaluation: Evaluation | None = None

    def on_learner(self, report: LearnerReport) -> None:
        self.version = report.version
        self.dropped += report.dropped
        self.skipped_updates += report.skipped_updates
        self.samples += report.samples
        self.sample_history.add(self.samples)
        self.stats.update(report.stats)


class MeasuredPeriod:
    """The steady state a benchmark measures: it begins when every actor worker has reported samples (actors finish
    building and resetting their envs at different times). Owns the moment it began with the counts and CPU times
    then, each component's seconds per activity and the inference batches since, and the session's policy lag."""

    def __init__(self, num_workers: int, clock: Clock) -> None:
        self.num_workers, self.clock = num_workers, clock
        self.sampling_actors: set[int] = set()
        self.began: tuple[float, int, int] | None = None  # (time, sampled env steps, trained samples) then
        self.cpu_at_start = psutil.cpu_times()
        self.timing: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.inference_obs = self.inference_batches = 0  # for the mean inference batch size
        self.lag = {"min": float("inf"), "max": 0.0, "avg_sum": 0.0, "reports": 0}

    def on_actor(self, report: ActorReport, env_steps: int, samples: int) -> None:
        """`env_steps` and `samples`: the run's counts with this report's; its steps were taken before now, so a
        period that begins now does not count them."""
        if self.began is not None or report.env_steps <= 0:
            return
        self.sampling_actors.add(report.worker)
        if len(self.sampling_actors) == self.num_workers:
            self.began = (self.clock(), env_steps, samples)
            self.cpu_at_start = psutil.cpu_times()
            self.inference_obs = self.inference_batches = 0

    def add_timing(self, component: str, timing: dict[str, float]) -> None:
        """Time shares describe the steady state: periods reported before it began are left out."""
        if self.began is None:
            return
        for key, seconds in timing.items():
            self.timing[component][key] += seconds

    def add_inference(self, samples: int, batches: int) -> None:
        self.inference_obs += samples
        self.inference_batches += batches

    def add_lag(self, stats: dict[str, float]) -> None:
        if "lag_avg" in stats:
            self.lag["min"] = min(self.lag["min"], stats["lag_min"])
            self.lag["max"] = max(self.lag["max"], stats["lag_max"])
            self.lag["avg_sum"] += stats["lag_avg"]
            self.lag["reports"] += 1

    def counts(self, env_steps: int, samples: int) -> tuple[float, int, int]:
        """Seconds, env steps and trained samples since it began, given the run's counts now; zeros before."""
        if self.began is None:
            return 0.0, 0, 0
        began, steps_before, samples_before = self.began
        return self.clock() - began, env_steps - steps_before, samples - samples_before


@dataclass
class Traffic:
    """What the head's cluster process did (--backend=ray) over some seconds: its busy seconds, the trajectory bytes
    it took in and the weights bytes it sent out, summed over the sampler groups."""

    seconds: float = 0.0
    busy: float = 0.0
    trajectory_bytes: int = 0
    weights_bytes: int = 0

    @classmethod
    def of(cls, report: ClusterReport) -> Traffic:
        """The one place where the sampler groups' bytes are summed."""
        return cls(report.seconds, report.busy, sum(group["traj_bytes"] for group in report.groups),
                   sum(group["weights_bytes"] for group in report.groups))

    def add(self, other: Traffic) -> None:
        self.seconds += other.seconds
        self.busy += other.busy
        self.trajectory_bytes += other.trajectory_bytes
        self.weights_bytes += other.weights_bytes

    def per_second(self) -> tuple[float, float, float]:
        """Trajectory bytes per second, weights bytes per second and the fraction of the time busy."""
        seconds = max(self.seconds, 1e-9)
        return self.trajectory_bytes / seconds, self.weights_bytes / seconds, self.busy / seconds


class ClusterTraffic:
    """--backend=ray: the cluster process's newest report (per sampler group: name, node, env steps, bytes moved,
    restarts) with its traffic, and the traffic summed over the measured period."""

    def __init__(self) -> None:
        self.report: ClusterReport | None = None
        self.latest = Traffic()
        self.measured = Traffic()

    def on_report(self, report: ClusterReport, measuring: bool) -> None:
        self.report, self.latest = report, Traffic.of(report)
        if measuring:
            self.measured.add(self.latest)

    def groups(self) -> list[dict[str, Any]]:
        return [] if self.report is None else self.report.groups

    def group_fps(self, group: dict[str, Any]) -> float:
        """A sampler group's env steps per second over the newest report's period."""
        return group["env_steps"] / max(self.latest.seconds, 1e-9)


class Tally:
    """The runner's intake: every report the workers send, summed or kept as its newest value. Owns each policy's
    env steps (trained + dropped, the budget's count) and PolicyTally, the env steps sampled this session and both
    counts over time, the faults survived, the measured period, the cluster traffic, each worker's last state, whether
    every env has ended an episode, and what the runner sets: `restarts`, `hyperparams`, `ratings`. Writes nothing."""

    def __init__(self, cfg: RunnerConfig, initial_env_steps: Sequence[int], clock: Clock) -> None:
        self.cfg, self.clock = cfg, clock
        self.start = clock()
        self.env_steps = list(initial_env_steps)
        self.policies = [PolicyTally(EpisodeWindow(cfg.stats_avg), CountHistory(clock, self.start, 0))
                         for _ in initial_env_steps]
        self.sampled_env_steps = 0  # this session, all policies, from the actors' reports
        self.sampled_history = CountHistory(clock, self.start, 0)
        self.env_step_history = CountHistory(clock, self.start, sum(initial_env_steps))  # for the budget's ETA
        # Faults the run survived since it started: env exceptions, non-finite rewards and observations (set to 0),
        # actions that an action mask did not allow (masked sampling makes none: a count above 0 is a bug);
        # the runner sets the worker restarts per role on this machine.
        self.env_errors = self.nonfinite_values = self.illegal_actions = 0
        self.restarts: dict[str, int] = {}
        self.hyperparams: list[dict[str, float]] | None = None  # set by the runner in PBT runs
        self.ratings = None  # appo.population.ratings.Ratings, set by the runner when games have several players
        self.period = MeasuredPeriod(cfg.num_workers, clock)
        # Every env starts its first episode at once, so the first episodes to end are the short ones: a window of
        # them says nothing of the policy (a random policy's lucky kills in doom_basic) until every env has ended
        # one, the long ones included. Set once every actor worker said so in a report; it stays set (a replaced
        # worker restarts only its own few envs).
        self.every_env_ended = False
        self.workers_ended: set[int] = set()
        self.cluster = ClusterTraffic()
        self.device = "?"
        self.states: dict[str, tuple[str, float]] = {}  # each worker's last reported state and when, for stalls
        self.last_progress = self.start  # when env steps last moved
        # The run's resident memory (every process), its peak, and what the machine or its cgroup allows, in MB.
        self.memory_mb = self.peak_memory_mb = 0.0
        self.memory_limit_mb = memory_limit_bytes() / 2**20

    def on_memory(self, memory_mb: dict[str, float]) -> None:
        """The resident memory of each process of the run, as the runner measured it."""
        self.memory_mb = sum(memory_mb.values())
        self.peak_memory_mb = max(self.peak_memory_mb, self.memory_mb)

    def on_actor(self, report: ActorReport) -> None:
        now = self.clock()
        self.states[f"actor_{report.worker}"] = (report.state, now)
        self.period.add_timing("actor", report.timing)
        if report.env_steps > 0:
            self.last_progress = now
        self.period.on_actor(report, self.sampled_env_steps + report.env_steps, self.samples())
        self.sampled_env_steps += report.env_steps
        self.env_errors += report.env_errors
        self.illegal_actions += report.illegal_actions
        self.nonfinite_values += report.nonfinite
        for episode in report.episodes:
            self.policies[episode.policy].episodes.add(episode)
        if report.every_env_ended and not self.every_env_ended:
            self.workers_ended.add(report.worker)
            self.every_env_ended = len(self.workers_ended) == self.cfg.num_workers

    def on_inference(self, report: InferenceReport) -> None:
        self.states[report.name] = (report.state, self.clock())
        self.period.add_inference(report.samples, report.batches)
        self.nonfinite_values += report.nonfinite
        self.period.add_timing("inference", report.timing)

    def on_learner(self, report: LearnerReport) -> None:
        self.states[f"learner_p{report.policy}"] = (report.state, self.clock())
        self.env_steps[report.policy] = report.env_steps
        self.policies[report.policy].on_learner(report)
        self.nonfinite_values += report.nonfinite
        self.period.add_lag(report.stats)
        self.device = report.device
        self.period.add_timing("learner", report.timing)

    def on_cluster(self, report: ClusterReport) -> None:
        self.cluster.on_report(report, measuring=self.period.began is not None)

    def on_evaluation(self, report: Evaluation) -> None:
        self.policies[report.policy].evaluation = report

    def tick(self, learner_env_steps: np.ndarray | None = None) -> None:
        """Add the counts to their histories; `learner_env_steps` (the learners' shared counters, set after every
        iteration) keeps each policy's env steps current between its learner's reports."""
        self.sampled_history.add(self.sampled_env_steps)
        if learner_env_steps is not None:
            self.env_steps = [max(ours, int(theirs)) for ours, theirs in zip(self.env_steps, learner_env_steps)]
        self.env_step_history.add(self.total_env_steps())

    def total_env_steps(self) -> int:
        return sum(self.env_steps)

    def samples(self) -> int:
        """Samples trained this session, all policies."""
        return sum(policy.samples for policy in self.policies)

    def fault_counts(self) -> dict[str, int]:
        """The faults of this session: env errors, non-finite values, illegal actions, worker restarts per role."""
        return {"env_errors": self.env_errors, "nonfinite_values": self.nonfinite_values,
                "illegal_actions": self.illegal_actions,
                **{f"restarts_{role}": n for role, n in sorted(self.restart_counts().items())}}

    def restart_counts(self) -> dict[str, int]:
        """Worker restarts per role on this machine and on the cluster's nodes, and replaced sampler groups."""
        counts = dict(self.restarts)
        for group in self.cluster.groups():
            for role, n in group["restarts"].items():
                counts[role] = counts.get(role, 0) + n
            counts["sampler group"] = counts.get("sampler group", 0) + group["replacements"]
        return counts
