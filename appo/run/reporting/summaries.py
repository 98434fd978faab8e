"""Tensorboard summaries, one event file per policy under <experiment>/summaries/<policy>/."""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from appo.config.views import RunnerConfig
from appo.messages import Evaluation
from appo.run.reporting.numbers import Numbers
from appo.run.reporting.tally import Tally
from appo.utils.logs import log
from appo.utils.resources import write_failure


def guarded(write: Callable) -> Callable:
    """A summary write that may fail (a full disk, a read-only filesystem, no room in /dev/shm for tensorboardX's
    queue): the first failure is said in one line and summaries stop, so the run goes on without them."""

    @functools.wraps(write)
    def wrapper(self: SummaryWriters, *args: Any) -> None:
        if self.failed:
            return
        try:
            write(self, *args)
        except OSError as exc:
            self.fail(exc)

    return wrapper


def import_tensorboardx_without_torch() -> type:
    """tensorboardX's SummaryWriter, imported without torch where torch is not loaded yet: tensorboardX imports it
    only to accept tensors (optional there), and that import costs the runner a second of a core and 200 MB, the first
    time a summary is written (a short run: at its end, before the line that says why it stopped)."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # makes `import torch` raise ImportError, which tensorboardX handles
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


class SummaryWriters:
    """Writes a Tally and its Numbers to tensorboard: perf/, episode/, episode_extra/, learner/, lag/, memory/,
    faults/ and, in their runs, cluster/, pbt/, selfplay/ and eval/, each at the policy's env steps. The writers are
    made on first use, after the runner forked the workers, and without torch
    (import_tensorboardx_without_torch). Owns the writers; reads everything else."""

    def __init__(self, tally: Tally, numbers: Numbers, cfg: RunnerConfig, exp_dir: str) -> None:
        self.tally, self.numbers, self.cfg, self.exp_dir = tally, numbers, cfg, exp_dir
        self._writers: list | None = None
        self.failed = False  # a write failed: no more summaries this run

    @property
    def writers(self) -> list:
        if self._writers is None:
            SummaryWriter = import_tensorboardx_without_torch()
            self._writers = [SummaryWriter(os.path.join(self.exp_dir, "summaries", str(p)), flush_secs=10)
                             for p in range(self.cfg.num_policies)]
            self._catch_background_failures()
        return self._writers

    def fail(self, error: OSError) -> None:
        """Summaries stop, said once in one line (called for a write here or in tensorboardX's own thread)."""
        if not self.failed:
            self.failed = True
            log.error("tensorboard summaries stop: %s", write_failure(os.path.join(self.exp_dir, "summaries"), error))

    def _catch_background_failures(self) -> None:
        """tensorboardX flushes in a thread of its own and once more at exit; an OSError there (a full disk) is
        said like the others, in one line, instead of a traceback on stderr at every flush."""
        thread_hook, unraisable_hook = threading.excepthook, sys.unraisablehook

        def on_thread_error(args: threading.ExceptHookArgs) -> None:
            if isinstance(args.exc_value, OSError):
                self.fail(args.exc_value)
            else:
                thread_hook(args)

        def on_unraisable(args: Any) -> None:
            if isinstance(args.exc_value, OSError) and self.failed:
                return
            unraisable_hook(args)

        threading.excepthook, sys.unraisablehook = on_thread_error, on_unraisable

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

    def _write_policy(self, p: int, writer: Any, step: int) -> None:
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

    def _write_run(self, writer: Any, step: int) -> None:
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
