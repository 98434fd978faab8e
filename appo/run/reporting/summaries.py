"""Tensorboard summaries, one event file per policy under <experiment>/summaries/<policy>/."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from appo.config.views import RunnerConfig
from appo.messages import Evaluation
from appo.run.reporting.event_file import EventFile
from appo.run.reporting.numbers import Numbers
from appo.run.reporting.tally import Tally
from appo.utils.logs import log
from appo.utils.resources import write_failure


def guarded(write: Callable) -> Callable:
    """A summary write that may fail (a full disk, a read-only filesystem): the first failure is said in one line
    and summaries stop, so the run goes on without them."""

    @functools.wraps(write)
    def wrapper(self: SummaryWriters, *args: Any) -> None:
        if self.failed:
            return
        try:
            write(self, *args)
        except OSError as exc:
            self.fail(exc)

    return wrapper


class SummaryWriters:
    """Writes a Tally and its Numbers to tensorboard: perf/, episode/, episode_extra/, learner/, lag/, memory/,
    faults/ and, in their runs, cluster/, pbt/, selfplay/ and eval/, each at the policy's env steps. The event files
    are made on first use (event_file.py: no torch in the runner). Owns them; reads everything else."""

    def __init__(self, tally: Tally, numbers: Numbers, cfg: RunnerConfig, exp_dir: str) -> None:
        self.tally, self.numbers, self.cfg, self.exp_dir = tally, numbers, cfg, exp_dir
        self._writers: list[EventFile] | None = None
        self.failed = False  # a write failed: no more summaries this run

    @property
    def writers(self) -> list[EventFile]:
        if self._writers is None:
            self._writers = [EventFile(os.path.join(self.exp_dir, "summaries", str(p)))
                             for p in range(self.cfg.num_policies)]
        return self._writers

    def fail(self, error: OSError) -> None:
        """Summaries stop, said once in one line."""
        if not self.failed:
            self.failed = True
            log.error("tensorboard summaries stop: %s", write_failure(os.path.join(self.exp_dir, "summaries"), error))

    @guarded
    def write(self, memory_mb: dict[str, float]) -> None:
        """Everything, for every policy; run-wide counts go with the first policy."""
        for p, writer in enumerate(self.writers):
            step = self.tally.env_steps[p]
            self._write_policy(p, writer, step)
            for name, mb in memory_mb.items():
                writer.add_scalar(f"memory/{name}_mb", mb, step)
            if p == 0:
                self._write_run(writer, step)
            if self.tally.hyperparams is not None:
                self.write_pbt(p)
            if self.tally.ratings is not None:
                self.write_ratings(p)

    def _write_policy(self, p: int, writer: EventFile, step: int) -> None:
        policy, numbers = self.tally.policies[p], self.numbers
        writer.add_scalar("perf/fps_10s", numbers.fps(10), step)
        writer.add_scalar("perf/fps_60s", numbers.fps(60), step)
        writer.add_scalar("perf/samples_per_s", numbers.sample_throughput(p), step)
        writer.add_scalar("perf/policy_version", policy.version, step)
        writer.add_scalar("perf/dropped_trajectories", policy.dropped, step)
        episode = numbers.mean_episode(p)
        if episode is not None:
            writer.add_scalar("episode/reward", episode[0], step)
            writer.add_scalar("episode/length", episode[1], step)
        for name, value in numbers.extra_means(p).items():
            writer.add_scalar(f"episode_extra/{name}", value, step)
        for key, value in policy.stats.items():
            group = "lag" if key.startswith("lag") else "learner"
            writer.add_scalar(f"{group}/{key}", value, step)
        writer.add_scalar("faults/skipped_updates", policy.skipped_updates, step)

    def _write_run(self, writer: EventFile, step: int) -> None:
        """The run-wide faults and, with --backend=ray, the cluster's rates."""
        tally = self.tally
        writer.add_scalar("faults/env_errors", tally.env_errors, step)
        writer.add_scalar("faults/nonfinite_values", tally.nonfinite_values, step)
        restarts = tally.restart_counts()
        for role in ("actor", "inference", "learner"):
            writer.add_scalar(f"faults/restarts_{role}", restarts.get(role, 0), step)
        cluster = tally.cluster
        if cluster.report is None:
            return
        for group in cluster.groups():
            writer.add_scalar(f"cluster/{group['name']}_fps", cluster.group_fps(group), step)
        trajectories, weights, busy = cluster.latest.per_second()
        writer.add_scalar("cluster/trajectory_bytes_per_s", trajectories, step)
        writer.add_scalar("cluster/weights_bytes_per_s", weights, step)
        writer.add_scalar("cluster/head_busy", busy, step)
        writer.add_scalar("faults/sampler_groups_replaced", restarts.get("sampler group", 0), step)

    @guarded
    def write_evaluation(self, report: Evaluation) -> None:
        """All of an evaluation's results, under eval/, at the env steps it was taken at."""
        for name, value in report.results.items():
            self.writers[report.policy].add_scalar(f"eval/{name}", value, report.env_steps)

    @guarded
    def write_pbt(self, policy: int) -> None:
        """The policy's current hyper-parameters and objective, under pbt/."""
        writer, step = self.writers[policy], self.tally.env_steps[policy]
        for name, value in self.tally.hyperparams[policy].items():
            writer.add_scalar(f"pbt/{name}", value, step)
        objective = self.numbers.mean_objective(policy)
        if objective is not None:
            writer.add_scalar("pbt/objective", objective, step)

    @guarded
    def write_ratings(self, policy: int) -> None:
        """The policy's Elo and its win/draw/loss rates against snapshots and other policies, under selfplay/; the
        whole table of pairs as text."""
        writer, step, ratings = self.writers[policy], self.tally.env_steps[policy], self.tally.ratings
        name = f"p{policy}"
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

    @guarded
    def close(self) -> None:
        for writer in self._writers or []:
            writer.close()
