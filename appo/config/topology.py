"""The shape of a run's process graph, derived from the flags: which inference workers serve which policies,
how many trajectories make an iteration, and whether a seeded run goes in lockstep.

An inference *shard* is a set of acting ids (policies and their self-play snapshots) served by its own
--policy_workers_per_policy inference workers; with --shared_inference_workers=True there is one shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appo.population.matchmaking import num_acting_ids, snapshot_ids

if TYPE_CHECKING:
    from appo.config.flags import Config
    from appo.config.views import ActorConfig, InferenceConfig, LearnerConfig, RunnerConfig


def inference_shards(cfg: Config | InferenceConfig | RunnerConfig) -> list[list[int]]:
    """The acting ids (policies and their self-play snapshots, appo/population/matchmaking.py) each inference worker
    serves, consecutive; there are --policy_workers_per_policy workers per shard."""
    if cfg.shared_inference_workers:
        return [list(range(num_acting_ids(cfg)))]
    # With snapshots this happens only for one policy (validate_self_play): ids 0..K, consecutive.
    return [[p, *snapshot_ids(cfg, p)] for p in range(cfg.num_policies)]


def inference_shard_of(cfg: Config | ActorConfig) -> list[int]:
    """For each acting id, the shard of inference workers that serves it."""
    return [shard for shard, ids in enumerate(inference_shards(cfg)) for _ in ids]


def inference_name(cfg: Config | InferenceConfig | RunnerConfig, shard: int, index: int) -> str:
    if cfg.shared_inference_workers or cfg.num_policies == 1:
        return f"inference_{index}"
    return f"inference_p{shard}_{index}"


def trajectories_per_iteration(cfg: Config | ActorConfig | LearnerConfig) -> int:
    return cfg.batch_size * cfg.num_batches_per_iteration // cfg.rollout


def lockstep(cfg: Config | ActorConfig | RunnerConfig) -> bool:
    """Seeded runs with one actor, split, policy and inference worker are made repeatable.

    Asynchrony is the only source of randomness left once seeds are fixed: which weight version
    serves a step depends on timing. In lockstep the actor waits at each rollout boundary until the
    learner has trained on everything sent so far, which makes the run synchronous PPO.
    """
    return (cfg.seed is not None and cfg.backend == "local" and not cfg.sampler_only and cfg.num_workers == 1
            and cfg.worker_num_splits == 1 and cfg.num_policies == 1 and cfg.policy_workers_per_policy == 1)
