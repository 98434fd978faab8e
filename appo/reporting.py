"""Aggregation of worker reports in the runner: FPS windows, episode statistics, learner statistics.

Workers send small dicts (see `actor_worker._report`, `inference_worker._report`, `learner._report`);
this module turns them into the printed status line and the per-policy tensorboard summaries.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict, deque

import numpy as np
from tensorboardX import SummaryWriter

FPS_WINDOWS = (10, 60, 300)


class Reports:
    def __init__(self, cfg, exp_dir: str, initial_env_steps: list[int]):
        self.cfg = cfg
        self.num_policies = cfg.num_policies
        self.start = time.monotonic()
        self.sampled_env_steps = 0  # this session, all policies, from actor reports
        self.frame_history: deque[tuple[float, int]] = deque([(self.start, 0)])
        self.episodes = [deque(maxlen=cfg.stats_avg) for _ in range(self.num_policies)]
        self.episodes_total = [0] * self.num_policies
        self.env_errors = 0
        self.env_steps = list(initial_env_steps)  # trained + dropped env steps per policy (learner count)
        self.versions = [0] * self.num_policies
        self.dropped = [0] * self.num_policies
        self.learner_stats: list[dict[str, float]] = [{} for _ in range(self.num_policies)]
        self.sample_history = [deque([(self.start, 0)]) for _ in range(self.num_policies)]
        self.samples_total = [0] * self.num_policies
        self.timing: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.device = "?"
        self.writers = [SummaryWriter(os.path.join(exp_dir, "summaries", str(p)), flush_secs=10)
                        for p in range(self.num_policies)]

    # ---------------------------------------------------------------- intake
    def on_actor(self, data: dict) -> None:
        self.sampled_env_steps += data["env_steps"]
        self.env_errors += data["env_errors"]
        for policy, reward, length in data["episodes"]:
            self.episodes[policy].append((reward, length))
            self.episodes_total[policy] += 1
        self._add_timing("actor", data["timing"])

    def on_inference(self, policy: int, data: dict) -> None:
        self._add_timing("inference", data["timing"])

    def on_learner(self, policy: int, data: dict) -> None:
        self.env_steps[policy] = data["env_steps"]
        self.versions[policy] = data["version"]
        self.dropped[policy] += data["dropped"]
        self.samples_total[policy] += data["samples"]
        self.sample_history[policy].append((time.monotonic(), self.samples_total[policy]))
        self.learner_stats[policy].update(data["stats"])
        self.device = data["device"]
        self._add_timing("learner", data["timing"])

    def _add_timing(self, component: str, timing: dict[str, float]) -> None:
        for key, seconds in timing.items():
            self.timing[component][key] += seconds

    # ---------------------------------------------------------------- derived numbers
    def tick(self) -> None:
        now = time.monotonic()
        self.frame_history.append((now, self.sampled_env_steps))
        while self.frame_history[0][0] < now - max(FPS_WINDOWS) - 5:
            self.frame_history.popleft()

    @staticmethod
    def _rate(history: deque, window: float) -> float:
        now, latest = history[-1]
        for t, count in history:
            if t >= now - window:
                return (latest - count) / (now - t) if now > t else 0.0
        return 0.0

    def fps(self, window: float) -> float:
        return self._rate(self.frame_history, window)

    def sample_throughput(self, policy: int, window: float = 10.0) -> float:
        return self._rate(self.sample_history[policy], window)

    def mean_episode(self, policy: int) -> tuple[float, float] | None:
        if not self.episodes[policy]:
            return None
        rewards, lengths = zip(*self.episodes[policy])
        return float(np.mean(rewards)), float(np.mean(lengths))

    def solved_policy(self, target: float) -> int | None:
        """A policy whose mean reward over a full window of --stats_avg episodes reaches target."""
        for policy in range(self.num_policies):
            window = self.episodes[policy]
            if len(window) == window.maxlen and np.mean([r for r, _ in window]) >= target:
                return policy
        return None

    def total_env_steps(self) -> int:
        return sum(self.env_steps)

    # ---------------------------------------------------------------- output
    def status_line(self) -> str:
        fps = ", ".join(f"{w}s: {self.fps(w):.1f}" for w in FPS_WINDOWS)
        parts = [f"FPS ({fps}) | env steps {self.total_env_steps()}"]
        for p in range(self.num_policies):
            stats = self.learner_stats[p]
            episode = self.mean_episode(p)
            text = f"p{p}: v{self.versions[p]} {self.sample_throughput(p):.0f} samples/s"
            if "lag_avg" in stats:
                text += f", lag {stats['lag_min']:.0f}/{stats['lag_avg']:.1f}/{stats['lag_max']:.0f}"
            if episode is not None:
                text += (f", reward {episode[0]:.2f} length {episode[1]:.1f} "
                         f"({len(self.episodes[p])} of {self.episodes_total[p]} episodes)")
            parts.append(text)
        return " | ".join(parts)

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
            for key, value in self.learner_stats[p].items():
                group = "lag" if key.startswith("lag") else "learner"
                writer.add_scalar(f"{group}/{key}", value, step)
            for name, mb in memory_mb.items():
                writer.add_scalar(f"memory/{name}_mb", mb, step)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
