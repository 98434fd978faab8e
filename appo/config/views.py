"""Each worker role's view of the run's flags: a frozen record of the flags that role reads, and no others.

A worker builds its view once at start-up from the run's `Config` (`ActorConfig.of(ctx.cfg)`), so a reader sees in
one place everything a role depends on, and a flag a role does not declare cannot be read by it. The fields count
the flags a role reads through the helpers it calls too (topology, matchmaking, the model, init_worker).
tests/test_config.py parses each role's modules and checks that every `cfg.<name>` they read is a field of their
view. The hyper-parameters PBT may change are in no view: a learner reads them from its policy's `Hyperparams`
(appo/config/hyperparams.py). Each field means what the flag of the same name does (appo/config/flags.py).
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from appo.config.flags import ELO_OBJECTIVE
from appo.config.topology import inference_shards

View = TypeVar("View", bound="RoleView")


class RoleView:
    """The one way to make a view: the fields of the view class, taken from the run's `Config`."""

    @classmethod
    def of(cls: type[View], cfg: Any) -> View:
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class ActorConfig(RoleView):
    """What an actor worker reads: its envs, how it steps them, which policy acts for each agent, and when a
    trajectory is sent (appo/sampling/ except the inference worker and the sampler group)."""

    env: str
    env_kwargs: str
    action_mask: str
    seed: int | None
    num_workers: int
    worker_num_splits: int
    batched_sampling: bool
    rollout: int
    use_rnn: bool
    backend: str
    sampler_only: bool
    batch_size: int
    num_batches_per_iteration: int
    decorrelate_experience_max_seconds: float
    decorrelate_envs_on_one_worker: bool
    set_workers_cpu_affinity: bool
    force_envs_single_thread: bool
    default_niceness: int
    actor_niceness: int
    actor_sched_batch: bool
    num_policies: int
    policy_workers_per_policy: int
    shared_inference_workers: bool
    agent_policy_mapping: str
    policy_mapping: str | None
    pbt_mix_policies_in_one_env: bool
    self_play_opponents: int
    self_play_latest_fraction: float
    random_opening_moves: int
    with_pbt: bool
    pbt_target_objective: str


@dataclass(frozen=True, kw_only=True)
class ModelFlags(RoleView):
    """The flags that build the model (appo/learning/model.py): every role that runs it reads them."""

    encoder: str
    action_mask: str
    mirror_symmetry: bool
    hidden_size: int
    mlp_layers: int
    use_rnn: bool
    rnn_type: str
    actor_critic_share_weights: bool
    initial_stddev: float
    normalize_input: bool
    normalize_returns: bool


@dataclass(frozen=True, kw_only=True)
class InferenceConfig(ModelFlags):
    """What an inference worker reads: the policies and actors it serves, the model and where it runs
    (appo/sampling/inference_worker.py, appo/learning/model.py)."""

    seed: int | None
    device: str
    default_niceness: int
    inference_bf16: bool
    num_workers: int
    worker_num_splits: int
    num_policies: int
    policy_workers_per_policy: int
    shared_inference_workers: bool
    self_play_opponents: int
    with_vtrace: bool


@dataclass(frozen=True, kw_only=True)
class LearnerConfig(ModelFlags):
    """What a learner reads besides its `Hyperparams`: the model, the batch, the PPO epochs and the loss terms PBT
    leaves alone, checkpoints and self-play snapshots (appo/learning/ except the evaluator)."""

    seed: int | None
    device: str
    default_niceness: int
    learner_torch_threads: int
    learner_bf16: bool
    learner_processes_per_policy: int
    learner_master_addr: str
    learner_master_port: int
    num_policies: int
    sampler_only: bool
    train_for_env_steps: int
    lr_schedule: str
    lr_schedule_kl_threshold: float
    recurrence: int
    rollout: int
    batch_size: int
    num_batches_per_iteration: int
    ppo_epochs: int
    adaptive_epochs: bool
    num_minibatches_to_accumulate: int
    max_policy_lag: int
    with_vtrace: bool
    vtrace_rho: float
    vtrace_c: float
    normalize_advantage: bool
    recompute_advantages: bool
    minibatch_unit: str
    value_bootstrap: bool
    reward_scale: float
    reward_clip: float
    adam_eps: float
    adam_beta1: float
    adam_beta2: float
    exploration_loss: str
    kl_loss_coeff: float
    proximal_policy: str
    save_every_sec: float
    keep_checkpoints: int
    self_play_opponents: int
    self_play_snapshot_every: int


@dataclass(frozen=True, kw_only=True)
class EvaluatorConfig(ModelFlags):
    """What the evaluator reads: its envs, the model, and what it plays and keeps (appo/learning/evaluator.py,
    appo/learning/model.py, appo/learning/trained_policy.py)."""

    env: str
    env_kwargs: str
    default_niceness: int
    num_policies: int
    eval_episodes: int
    save_best_metric: str


@dataclass(frozen=True, kw_only=True)
class RunnerConfig(RoleView):
    """What the runner reads: the process graph it wires and supervises, when to stop, what to report (and to which
    trackers) and PBT's schedule (appo/run/, appo/sampling/sampler_group.py). The runner also holds the whole
    `Config`, to hand it to the workers it starts and to the trackers (appo/tracking/), which read their own flags
    and keep all of them as the run's config."""

    env: str
    seed: int | None
    backend: str
    serial_mode: bool
    ray_address: str
    ray_workers_per_node: int
    num_workers: int
    num_envs_per_worker: int
    worker_num_splits: int
    num_policies: int
    learner_processes_per_policy: int
    policy_workers_per_policy: int
    shared_inference_workers: bool
    self_play_opponents: int
    rollout: int
    batch_size: int
    num_batches_per_iteration: int
    num_minibatches_to_accumulate: int
    min_traj_buffers_per_worker: int
    use_rnn: bool
    rnn_type: str
    hidden_size: int
    actor_critic_share_weights: bool
    sampler_only: bool
    default_niceness: int
    actor_niceness: int
    actor_sched_batch: bool
    reset_timeout_seconds: float
    stall_timeout_seconds: float
    env_timeout_seconds: float
    max_worker_restarts: int
    train_for_env_steps: int
    train_for_seconds: float
    target_reward: float | None
    target_objective: float | None
    benchmark: bool
    benchmark_env_steps: int
    benchmark_samples: int
    benchmark_raw_limit_s: float
    env_kwargs: str
    batched_sampling: bool
    report_interval: float
    experiment_summaries_interval: float
    stats_avg: int
    with_jsonl: bool
    with_wandb: bool
    with_mlflow: bool
    eval_every_env_steps: int
    with_pbt: bool
    pbt_period_env_steps: int
    pbt_start_mutation: int
    pbt_replace_fraction: float
    pbt_mutation_rate: float
    pbt_resample_probability: float
    pbt_replace_reward_gap: float
    pbt_replace_reward_gap_absolute: float
    pbt_replace_elo_gap: float
    pbt_replace_confidence: float
    pbt_perturb_min: float
    pbt_perturb_max: float
    pbt_optimize_gamma: bool
    pbt_target_objective: str
    max_grad_norm: float
    exploration_loss_coeff: float
    lr_schedule: str

    @property
    def inference_processes(self) -> int:
        """Inference worker processes: --policy_workers_per_policy per inference shard."""
        return len(inference_shards(self)) * self.policy_workers_per_policy

    @property
    def show_objective(self) -> bool:
        """Whether the status shows each policy's objective (PBT ranks by it, or a target is set on it)."""
        return self.with_pbt or self.target_objective is not None

    @property
    def elo_objective(self) -> bool:
        """PBT ranks by Elo (--pbt_target_objective=elo): the ratings lines show the objective."""
        return self.pbt_target_objective == ELO_OBJECTIVE


ROLE_VIEWS = (ActorConfig, InferenceConfig, LearnerConfig, EvaluatorConfig, RunnerConfig)
