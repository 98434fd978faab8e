"""The flags reporting reads, as one frozen record built once from the parsed flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from appo.config.flags import ELO_OBJECTIVE
from appo.config.topology import inference_shards

if TYPE_CHECKING:
    from appo.config.flags import Config
    from appo.config.views import RunnerConfig


@dataclass(frozen=True)
class ReportingConfig:
    """What the intake, the derived numbers, the text and the benchmark summary need to know about the run."""

    num_policies: int
    num_workers: int  # actor worker processes: the measured period begins once each has sampled
    num_envs_per_worker: int
    worker_num_splits: int
    inference_processes: int  # inference shards x --policy_workers_per_policy
    stats_avg: int  # episodes in each policy's mean reward, length and objective
    show_objective: bool  # --with_pbt or --target_objective: the status shows each policy's objective
    elo_objective: bool  # PBT ranks by Elo (--pbt_target_objective=elo): the ratings lines show it
    train_for_env_steps: int
    train_for_seconds: float
    benchmark: bool
    benchmark_env_steps: int
    benchmark_samples: int
    sampler_only: bool
    actor_niceness: int
    actor_sched_batch: bool

    @classmethod
    def from_cfg(cls, cfg: Config | RunnerConfig) -> ReportingConfig:
        return cls(
            num_policies=cfg.num_policies, num_workers=cfg.num_workers, num_envs_per_worker=cfg.num_envs_per_worker,
            worker_num_splits=cfg.worker_num_splits,
            inference_processes=len(inference_shards(cfg)) * cfg.policy_workers_per_policy,
            stats_avg=cfg.stats_avg, show_objective=cfg.with_pbt or cfg.target_objective is not None,
            elo_objective=cfg.pbt_target_objective == ELO_OBJECTIVE,
            train_for_env_steps=cfg.train_for_env_steps, train_for_seconds=cfg.train_for_seconds,
            benchmark=cfg.benchmark, benchmark_env_steps=cfg.benchmark_env_steps,
            benchmark_samples=cfg.benchmark_samples, sampler_only=cfg.sampler_only,
            actor_niceness=cfg.actor_niceness, actor_sched_batch=cfg.actor_sched_batch)
