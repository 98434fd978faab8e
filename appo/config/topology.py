"""The shape of a run's process graph, derived from the flags: who acts, which inference workers serve whom, how many
trajectories make an iteration, and whether a seeded run goes in lockstep.

Acting ids. Requests for actions, weights and versions are indexed by an *acting id*: the learning policies
are ids 0..P-1 (each with a learner), and with `--self_play_opponents=K` policy p's K snapshots are the ids
P + p*K + k, k = 0..K-1. A snapshot has no learner: its learner writes its weights into the snapshot's slot of
the pool every `--self_play_snapshot_every` versions (a ring: the oldest is overwritten), and inference workers
serve it like any policy. `SharedControl.policy_version[id]` is -1 until a snapshot exists, then the version of
the learning policy it was taken from. Who plays which acting id: appo/population/matchmaking.py.

An inference *shard* is a set of acting ids served by its own --policy_workers_per_policy inference workers; with
--shared_inference_workers=True there is one shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appo.config.flags import Config
    from appo.config.views import ActorConfig, InferenceConfig, LearnerConfig, RunnerConfig


def group_port(cfg: Config, policy_id: int) -> int:
    """The port where rank 0 of policy `policy_id`'s learner group listens (--learner_processes_per_policy > 1): 0, a
    free port the system picks for each group when it starts (so that runs at once never meet on one), or with
    --learner_master_port pinned, one per policy from it, which the learner ranks (appo/learning/ranks.py) and the
    check that it is free (appo/preflight.py) count alike."""
    return cfg.learner_master_port + policy_id if cfg.learner_master_port else 0


def num_acting_ids(cfg: Config) -> int:
    """Learning policies plus their snapshots."""
    return cfg.num_policies * (1 + cfg.self_play_opponents)


def snapshot_ids(cfg: Config, policy: int) -> range:
    """The acting ids of policy's snapshot pool."""
    first = cfg.num_policies + policy * cfg.self_play_opponents
    return range(first, first + cfg.self_play_opponents)


def learning_policy(cfg: Config, acting_id: int) -> int:
    """The learning policy an acting id belongs to (itself, or the policy a snapshot was taken from)."""
    if acting_id < cfg.num_policies:
        return acting_id
    return (acting_id - cfg.num_policies) // cfg.self_play_opponents


def inference_shards(cfg: Config | InferenceConfig | RunnerConfig) -> list[list[int]]:
    """The acting ids (policies and their self-play snapshots) each inference worker serves, consecutive; there are
    --policy_workers_per_policy workers per shard."""
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
