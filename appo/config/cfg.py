"""Command-line flags, their validation, and the experiment's saved `cfg.json`.

Every flag has a one- or two-sentence `--help` text. Bad values end the program with one line naming
the flag and what would be valid (`ConfigError`), before anything is written to the experiment dir.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from typing import Any


class ConfigError(Exception):
    """A user-facing configuration problem; its message is printed as one line."""


# The default of --train_for_env_steps and --train_for_seconds: no budget (a run goes on until stopped).
NO_BUDGET = 10_000_000_000


def str2bool(value: str) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.lower()
    if lowered in ("true", "1", "yes", "y", "t"):
        return True
    if lowered in ("false", "0", "no", "n", "f"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus error; users asked for one clear line instead."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message} (see --help)")


def _mutable_help() -> str:
    from appo.population.pbt import MUTABLE

    bounds = [f"{name} [{b.low:g}, {b.high:g}]" for name, b in MUTABLE.items()]
    return ", ".join(bounds) + " (gamma only with --pbt_optimize_gamma; max_grad_norm only when it is not 0)"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m appo.train",
        allow_abbrev=False,  # a prefix such as --num_worker is an error, not a guess
        description="Asynchronous PPO: actor workers, batched inference workers and one learner per policy. "
                    "Sample Factory's flag names are accepted too (listed next to ours; --rnn_size is --hidden_size, "
                    "which also sets the MLP width). A new experiment adapts some defaults to its env (flags marked "
                    "'Auto, when not given'); each choice is logged at start-up as 'auto: ...'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    from appo.config.auto import flag_help as auto

    g = p.add_argument_group("experiment")
    add = g.add_argument
    add("--env", type=str, required=True,
        help="Environment id: anything gymnasium.make accepts, including 'package.module:EnvName-v0'.")
    add("--env_kwargs", type=str, default="{}",
        help="JSON object of keyword arguments for the env's make function, e.g. '{\"step_seconds\": 0.001}'.")
    add("--experiment", type=str, default="default_experiment",
        help="Experiment name; all outputs go to <train_dir>/<experiment>/.")
    add("--train_dir", type=str, default="train_dir", help="Folder that holds experiment folders.")
    add("--restart", type=str2bool, default=False,
        help="Start the experiment over instead of resuming from its latest checkpoint; the old experiment dir is "
             "not deleted but renamed to <experiment>_before_restart_<YYYYmmdd-HHMMSS> next to it.")
    add("--seed", type=int, default=None,
        help="Seeds weights, env resets and action sampling. With one worker, split, policy and inference "
             "worker the run is then repeatable (the actor waits for each policy update).")
    add("--device", type=str, default="auto",
        help="Where inference and learning run: cpu, cuda (or gpu), cuda:N, or auto (cuda when available).")
    add("--restart_behavior", type=str, default=None, choices=sorted(RESTART_BEHAVIORS),
        help="Sample Factory's name for --restart: resume is False, restart and overwrite are True (the old "
             "experiment is renamed aside; nothing is ever deleted).")

    g = p.add_argument_group("sampling")
    add = g.add_argument
    add("--num_workers", type=int, default=2, help="Number of actor (rollout) worker processes.")
    add("--num_envs_per_worker", type=int, default=16,
        help="Environments stepped by each actor worker." + auto("num_envs_per_worker"))
    add("--worker_num_splits", type=int, default=2,
        help="Groups of envs per worker: one group steps while the other waits for actions (double buffering).")
    add("--num_policies", type=int, default=1,
        help="Number of policies trained together; each agent is mapped to a random policy per episode.")
    add("--policy_workers_per_policy", type=int, default=1,
        help="Inference worker processes per policy; actor w is served by worker w %% N, which batches all "
             "pending requests of its actors into one forward pass.")
    add("--agent_policy_mapping", type=str, default="auto", choices=["auto", "episode", "split"],
        help="Which policy acts for an env-agent: episode draws one per agent at every episode start; split gives "
             "all envs of a split one policy for the whole run (splits dealt round-robin), so a split step needs one "
             "forward pass instead of one per policy. auto: split for single-agent envs when every policy gets a "
             "split, else episode.")
    add("--shared_inference_workers", type=str2bool, default=True,
        help="With several policies, each of the --policy_workers_per_policy inference workers serves every policy "
             "(one process, one forward pass per policy); False: that many workers for each policy.")
    add("--rollout", type=int, default=32, help="Steps per trajectory sent from actors to the learner.")
    add("--min_traj_buffers_per_worker", type=int, default=2,
        help="Trajectory slots per env per worker; more slots let actors run ahead of the learner.")
    add("--decorrelate_experience_max_seconds", type=float, default=0.0,
        help="Each worker waits up to this many seconds before sampling so workers do not move in lockstep.")
    add("--decorrelate_envs_on_one_worker", type=str2bool, default=True,
        help="Take random actions for a random number of steps after the first reset of each env.")
    add("--set_workers_cpu_affinity", type=str2bool, default=False,
        help="Pin each actor worker to one CPU core (round robin). Off by default: with more workers than cores, "
             "pinned actors cannot move to a free core when theirs is busy (32 sleep-env workers on 2 cores: "
             "92%% of the raw limit pinned, 97%% not).")
    add("--force_envs_single_thread", type=str2bool, default=True,
        help="Limit BLAS/OpenMP threads in actor workers to one, so envs do not oversubscribe the cores.")
    add("--backend", type=str, default="local", choices=["local", "ray"],
        help="local: every process on this machine. ray: the runner, learners and PBT stay on this machine (the "
             "head); each Ray node runs a sampler group (actor workers and an inference worker per policy) and "
             "ships trajectories back through Ray's object store (pip install -e \".[ray]\"; docs/cluster.md).")
    add("--ray_address", type=str, default="",
        help="With --backend=ray: the cluster to join, as given to ray.init (host:port of the head started with "
             "'ray start --head', or auto). Empty: start a Ray instance on this machine alone.")
    add("--ray_workers_per_node", type=int, default=0,
        help="With --backend=ray: actor workers per sampler group (one group per node while nodes are free); "
             "--num_workers counts them over the whole cluster. 0: split --num_workers evenly over the nodes "
             "that have CPUs.")
    add("--reset_timeout_seconds", type=float, default=120.0,
        help="Fail the run if an actor worker cannot create and reset its envs within this many seconds.")
    add("--stall_timeout_seconds", type=float, default=120.0,
        help="Fail the run, naming what each worker waits for, if no env step is made for this many seconds "
             "(counted from the moment every worker has started).")
    add("--env_timeout_seconds", type=float, default=60.0,
        help="An actor inside one env's step or reset (or making an env) for longer than this is killed and "
             "replaced; the log names the worker, the env and the call.")
    add("--max_worker_restarts", type=int, default=10,
        help="A worker (actor, inference worker or learner) that dies is replaced, at most this many times per "
             "worker within an hour; one more death stops the run with its cause. 0: stop at the first death.")
    add("--default_niceness", type=int, default=0, help="Niceness (Unix priority) of the worker processes.")
    add("--actor_sched_batch", type=str2bool, default=True,
        help="Linux: run actor workers under SCHED_BATCH, so an actor waking from env.step does not preempt the "
             "inference worker or learner that every actor waits on (64 sleep-env workers on 2 cores: 82%% -> 85%% "
             "of the raw limit). Off: the default policy.")
    add("--actor_niceness", type=int, default=0,
        help="Extra niceness of actor workers. With more workers than cores, a few points let inference and "
             "learner run first (Breakout sampler-only, 2 workers x 32 envs on 2 cores: 61.8%% -> 65.2%% of the "
             "raw limit with 5)." + auto("actor_niceness"))
    add("--learner_torch_threads", type=int, default=1,
        help="CPU threads for the learner's torch ops; more helps CPU-only training of CNNs when cores are free.")
    add("--learner_bf16", type=str2bool, default=False,
        help="On a CPU, the learner runs image encoders under bfloat16 autocast (heads, losses and weights stay "
             "float32), for faster SGD (docs/PERFORMANCE.md). No effect on CUDA or on vector observations."
             + auto("learner_bf16"))
    add("--inference_bf16", type=str2bool, default=False,
        help="On a CPU, inference workers run image encoders under bfloat16 autocast, for faster forward passes "
             "(docs/PERFORMANCE.md); actions are sampled from float32 outputs. No effect on CUDA or on vector "
             "observations." + auto("inference_bf16"))
    add("--max_policy_lag", type=int, default=100,
        help="Trajectories collected by a policy more than this many versions old are dropped and counted.")

    g = p.add_argument_group("model")
    add = g.add_argument
    add("--encoder", type=str, default="auto",
        help="Observation encoder: auto (mlp for vectors; for images nature_cnn, or small_cnn (3x3 convolutions) "
             "when a side is under 36 pixels; said at start-up), mlp, nature_cnn, small_cnn, impala_resnet, "
             "a name registered with appo.learning.model.register_encoder, or package.module:factory.")
    add("--actor_critic_share_weights", type=str2bool, default=True,
        help="One encoder (and core) for policy and value heads; False gives the critic its own.")
    add("--normalize_input", type=str2bool, default=True,
        help="Normalise float observations by running mean/std (kept by the learner, used by inference); uint8 "
             "images are scaled to [0, 1] either way.")
    add("--normalize_returns", type=str2bool, default=True,
        help="Learn values in units of the running mean/std of the value targets (with PopArt's output "
             "preservation), so no --reward_scale has to be tuned to the task's reward sizes.")
    add("--hidden_size", "--rnn_size", type=int, default=64,
        help="Width of the MLP encoder layers and of the RNN core.")
    add("--mlp_layers", type=int, default=2, help="Number of hidden layers in the MLP encoder.")
    add("--use_rnn", type=str2bool, default=False, help="Use a recurrent core after the encoder.")
    add("--rnn_type", type=str, default="gru", choices=["gru", "lstm"], help="Recurrent core type.")
    add("--recurrence", type=int, default=-1,
        help="Back-propagation through time length; must divide --rollout. -1: --rollout with RNN, else 1.")

    g = p.add_argument_group("learning")
    add = g.add_argument
    add("--batch_size", type=int, default=256, help="Samples (env steps) per SGD minibatch.")
    add("--num_batches_per_iteration", "--num_batches_per_epoch", type=int, default=8,
        help="Minibatches per training iteration; an iteration uses batch_size * this many fresh samples. "
             + auto("num_batches_per_iteration"))
    add("--ppo_epochs", "--num_epochs", type=int, default=4,
        help="Passes over each iteration's samples." + auto("ppo_epochs"))
    add("--num_minibatches_to_accumulate", type=int, default=2,
        help="When more minibatches than this wait at a learner, actors pause collecting for that policy.")
    add("--ppo_clip_ratio", type=float, default=0.1,
        help="PPO clip e: the ratio is clipped to [1/(1+e), 1+e].")
    add("--ppo_clip_value", type=float, default=1.0,
        help="Value updates are clipped to this distance from the values at collection time.")
    add("--with_vtrace", type=str2bool, default=False,
        help="Use V-trace targets and advantages (off-policy corrected) instead of GAE.")
    add("--vtrace_rho", type=float, default=1.0, help="V-trace rho-bar: clip of importance weights in targets.")
    add("--vtrace_c", type=float, default=1.0, help="V-trace c-bar: clip of the trace-cutting coefficients.")
    add("--gae_lambda", type=float, default=0.98,
        help="GAE lambda (used when --with_vtrace=False)." + auto("gae_lambda"))
    add("--gamma", type=float, default=0.999, help="Discount factor." + auto("gamma"))
    add("--normalize_advantage", type=str2bool, default=True,
        help="Normalise advantages to zero mean and unit std within each minibatch.")
    add("--value_bootstrap", type=str2bool, default=True,
        help="On time-limit truncation add gamma * V(s) to the last reward instead of treating it as death.")
    add("--reward_scale", type=float, default=1.0,
        help="Rewards are multiplied by this before learning (and before --reward_clip); with "
             "--normalize_returns=False it keeps value targets near 1-10, so the value loss does not dominate.")
    add("--reward_clip", type=float, default=1000.0, help="Scaled rewards are clipped to [-x, x].")
    add("--learning_rate", type=float, default=1e-3, help="Adam learning rate." + auto("learning_rate"))
    add("--adam_eps", type=float, default=1e-6, help="Adam epsilon.")
    add("--adam_beta1", type=float, default=0.9, help="Adam beta1.")
    add("--adam_beta2", type=float, default=0.999, help="Adam beta2.")
    add("--max_grad_norm", type=float, default=4.0, help="Gradient norm clipping; 0 disables it.")
    add("--exploration_loss", type=str, default="entropy", choices=["entropy", "symmetric_kl"],
        help="Exploration bonus: policy entropy, or symmetric KL to a uniform/standard-normal prior.")
    add("--exploration_loss_coeff", type=float, default=0.003,
        help="Weight of the exploration loss." + auto("exploration_loss_coeff"))
    add("--value_loss_coeff", type=float, default=0.5, help="Weight of the value loss.")

    g = p.add_argument_group("population-based training (PBT)")
    add = g.add_argument
    add("--with_pbt", type=str2bool, default=False,
        help="Evolve the --num_policies policies while they train: every period, a policy ranked in the bottom "
             "fraction by its objective takes over the weights, optimizer state and hyper-parameters of a top one, "
             "and policies outside the top perturb their hyper-parameters and the env's reward shaping. Mutated, "
             f"within bounds: {_mutable_help()}.")
    add("--pbt_period_env_steps", type=int, default=25_000,
        help="Env steps of its own between two PBT decisions about a policy. The defaults of the --pbt_* flags "
             "suit runs of minutes on a workstation (scripts/pbt_experiment.py); runs of billions of steps want "
             "longer periods and smaller perturbations (Sample Factory: 5M steps, 0.15, [1.1, 1.5]).")
    add("--pbt_start_mutation", type=int, default=25_000,
        help="No PBT decision about a policy before it has taken this many env steps.")
    add("--pbt_replace_fraction", type=float, default=0.3,
        help="Fraction of the population (rounded up, at most half) forming the top that is copied and the bottom "
             "that is replaced.")
    add("--pbt_mutation_rate", type=float, default=0.5,
        help="Probability that each hyper-parameter and shaping coefficient is perturbed when a policy explores.")
    add("--pbt_replace_reward_gap", type=float, default=0.1,
        help="A bottom policy is replaced only if the top one's objective exceeds its own by this fraction of the "
             "larger magnitude of the two (works for negative returns too) ...")
    add("--pbt_replace_reward_gap_absolute", type=float, default=1e-6,
        help="... and by more than this absolute amount.")
    add("--pbt_optimize_gamma", type=str2bool, default=False, help="Let PBT mutate the discount factor too.")
    add("--pbt_perturb_min", type=float, default=1.5,
        help="A perturbed value is multiplied or divided (even odds) by a factor drawn from "
             "[--pbt_perturb_min, --pbt_perturb_max]; gamma and GAE lambda move on 1 - x.")
    add("--pbt_perturb_max", type=float, default=4.0,
        help="See --pbt_perturb_min. Wide by default: a value 100x off, where the objective barely responds, "
             "must still be left within a few dozen periods.")
    add("--pbt_target_objective", type=str, default="true_objective",
        help="What PBT ranks by, averaged over --stats_avg episodes: true_objective is the env's "
             "info['true_objective'] at an episode's end, or the episode return without it; any other name is a "
             "numeric value in the info of an episode's last step, or in its info['episode_extra_stats']. Never "
             "the shaped reward.")
    add("--pbt_mix_policies_in_one_env", type=str2bool, default=True,
        help="Multi-agent envs: draw a policy per agent; False: one policy for all agents of an env.")

    g = p.add_argument_group("multi-agent envs and self-play")
    add = g.add_argument
    add("--policy_mapping", type=str, default=None,
        help="package.module:function deciding the policies of an episode: function(num_agents, num_policies, rng) "
             "returns one policy id per agent, called at every episode start (rng: a numpy Generator). Default: a "
             "uniform draw per agent (per env with --pbt_mix_policies_in_one_env=False).")
    add("--self_play_opponents", type=int, default=0,
        help="Self-play with an opponent pool: keep this many frozen snapshots of each policy, served by the inference "
             "workers; in an episode one random seat plays the policy and learns, the others its latest self or one "
             "snapshot. Multi-agent envs only; 0: no pool (agents play the mapped policies).")
    add("--self_play_snapshot_every", type=int, default=100,
        help="Policy versions (training iterations) between two snapshots; the newest replaces the oldest.")
    add("--self_play_latest_fraction", type=float, default=0.5,
        help="Fraction of episodes in which the opponents are the policy's latest self rather than a snapshot drawn "
             "uniformly from its pool (always the latest self until the first snapshot exists).")

    g = p.add_argument_group("benchmarking")
    add = g.add_argument
    add("--benchmark", type=str2bool, default=False,
        help="Run a fixed budget and print a throughput table (frames/s, time shares, bottleneck); also "
             "written to benchmark.json in the experiment dir.")
    add("--benchmark_env_steps", type=int, default=2_000_000,
        help="Env steps after which a benchmark stops, counted once every actor is sampling.")
    add("--benchmark_samples", type=int, default=1_000_000,
        help="Trained samples after which a benchmark stops (whichever budget comes first).")
    add("--sampler_only", type=str2bool, default=False,
        help="Actors and inference run, trajectories are recycled without learning: measures the sampler alone.")

    g = p.add_argument_group("stopping, checkpoints and reporting")
    add = g.add_argument
    add("--train_for_env_steps", type=int, default=NO_BUDGET, help="Stop after this many env steps.")
    add("--train_for_seconds", type=float, default=NO_BUDGET,
        help="Stop after this many seconds of this session.")
    add("--target_reward", type=float, default=None,
        help="Stop (and mark done) once a policy's mean reward over the last --stats_avg episodes reaches this.")
    add("--target_objective", type=float, default=None,
        help="Stop (and mark done) once a policy's mean objective (see --pbt_target_objective) over the last "
             "--stats_avg episodes reaches this, e.g. a goal rate that the shaped reward does not show.")
    add("--save_every_sec", type=float, default=60.0,
        help="Seconds between periodic checkpoints: what a crash of the main process (or the machine) can lose. A "
             "learner that dies alone loses only the iteration it was training.")
    add("--keep_checkpoints", type=int, default=3, help="Checkpoints kept per policy; older ones are deleted.")
    add("--experiment_summaries_interval", type=float, default=10.0,
        help="Seconds between tensorboard summary writes.")
    add("--report_interval", type=float, default=5.0, help="Seconds between printed status lines.")
    add("--stats_avg", type=int, default=100, help="Episodes averaged in reported mean reward and length.")

    g = p.add_argument_group("evaluation during training")
    add = g.add_argument
    add("--eval_every_env_steps", type=int, default=0,
        help="Every this many env steps of a policy, play --eval_episodes deterministic episodes (most likely "
             "action) with its newest weights on envs of their own, in one low-priority evaluator process; the "
             "results go to tensorboard (eval/) and the status line. 0: no evaluation.")
    add("--eval_episodes", type=int, default=10, help="Episodes per evaluation.")
    add("--save_best_metric", type=str, default="reward",
        help="Evaluation result that picks a policy's best weights, kept as checkpoint_p<policy>/best.pth apart "
             "from the rolling checkpoints (higher is better): reward (the mean return), or an episode metric the "
             "env reports in info['episode_extra_stats'].")
    return p


# Flags that must be positive integers (a count of something).
POSITIVE_INTS = [
    "num_workers", "num_envs_per_worker", "worker_num_splits", "num_policies", "policy_workers_per_policy",
    "rollout", "min_traj_buffers_per_worker", "hidden_size", "batch_size", "num_batches_per_iteration",
    "ppo_epochs", "num_minibatches_to_accumulate", "keep_checkpoints", "stats_avg", "train_for_env_steps",
    "benchmark_env_steps", "benchmark_samples", "learner_torch_threads", "eval_episodes", "self_play_snapshot_every",
]
POSITIVE_FLOATS = ["train_for_seconds", "save_every_sec", "experiment_summaries_interval", "report_interval",
                   "gamma", "learning_rate", "adam_eps", "reset_timeout_seconds", "stall_timeout_seconds",
                   "env_timeout_seconds"]
# Flags that describe the model or the data layout; they must not change when resuming.
ARCHITECTURE_FLAGS = ["env", "env_kwargs", "use_rnn", "rnn_type", "hidden_size", "mlp_layers", "num_policies",
                      "encoder", "actor_critic_share_weights", "normalize_input", "normalize_returns"]


def validate(cfg: argparse.Namespace) -> None:
    for name in POSITIVE_INTS:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"--{name}={getattr(cfg, name)}: must be a positive integer")
    for name in POSITIVE_FLOATS:
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"--{name}={getattr(cfg, name)}: must be positive")
    if cfg.ray_workers_per_node < 0:
        raise ConfigError(f"--ray_workers_per_node={cfg.ray_workers_per_node}: must be 0 (split evenly) or more")
    if cfg.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError('--backend=ray needs Ray, which is not installed: pip install -e ".[ray]"')
    if cfg.eval_every_env_steps < 0:
        raise ConfigError(f"--eval_every_env_steps={cfg.eval_every_env_steps}: must be 0 (no evaluation) or more")
    if cfg.max_worker_restarts < 0:
        raise ConfigError(f"--max_worker_restarts={cfg.max_worker_restarts}: must be 0 or more")
    if not 0 <= cfg.actor_niceness <= 19:
        raise ConfigError(f"--actor_niceness={cfg.actor_niceness}: must be within [0, 19]")
    if cfg.policy_workers_per_policy > cfg.num_workers:
        raise ConfigError(f"--policy_workers_per_policy={cfg.policy_workers_per_policy}: more than "
                          f"--num_workers={cfg.num_workers}; each inference worker serves its own actors")
    if cfg.mlp_layers < 0:
        raise ConfigError(f"--mlp_layers={cfg.mlp_layers}: must be 0 or more")
    if cfg.num_envs_per_worker % cfg.worker_num_splits != 0:
        raise ConfigError(
            f"--num_envs_per_worker={cfg.num_envs_per_worker} is not divisible by "
            f"--worker_num_splits={cfg.worker_num_splits}; use a multiple of it"
        )
    if cfg.batch_size % cfg.rollout != 0:
        raise ConfigError(f"--batch_size={cfg.batch_size} must be a multiple of --rollout={cfg.rollout}")
    if cfg.recurrence != -1 and (cfg.recurrence <= 0 or cfg.rollout % cfg.recurrence != 0):
        raise ConfigError(f"--recurrence={cfg.recurrence} must be -1 or a positive divisor of --rollout={cfg.rollout}")
    if not cfg.use_rnn and cfg.recurrence not in (-1, 1):
        raise ConfigError(f"--recurrence={cfg.recurrence} needs --use_rnn=True (feed-forward models use 1)")
    if not 0.0 <= cfg.gae_lambda <= 1.0:
        raise ConfigError(f"--gae_lambda={cfg.gae_lambda}: must be within [0, 1]")
    if cfg.gamma > 1.0:
        raise ConfigError(f"--gamma={cfg.gamma}: must be within (0, 1]")
    if cfg.ppo_clip_ratio <= 0 or cfg.ppo_clip_value <= 0:
        raise ConfigError("--ppo_clip_ratio and --ppo_clip_value must be positive")
    if cfg.max_policy_lag < 0:
        raise ConfigError(f"--max_policy_lag={cfg.max_policy_lag}: must be 0 or more")
    if cfg.with_pbt:
        validate_pbt(cfg)
    validate_self_play(cfg)
    if not (cfg.device in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", cfg.device)):
        raise ConfigError(f"--device={cfg.device}: use cpu, cuda, cuda:N or auto")
    env_kwargs(cfg)
    validate_encoder(cfg.encoder)
    for name in ("experiment",):
        value = getattr(cfg, name)
        if not value or os.sep in value or value in (".", ".."):
            raise ConfigError(f"--{name}={value!r}: must be a plain folder name")


def validate_pbt(cfg: argparse.Namespace) -> None:
    if cfg.num_policies < 2:
        raise ConfigError(f"--with_pbt=True needs a population: --num_policies={cfg.num_policies} must be 2 or more")
    if cfg.pbt_period_env_steps <= 0 or cfg.pbt_start_mutation < 0:
        raise ConfigError("--pbt_period_env_steps must be positive and --pbt_start_mutation 0 or more")
    if not 0 < cfg.pbt_replace_fraction <= 0.5:
        raise ConfigError(f"--pbt_replace_fraction={cfg.pbt_replace_fraction}: must be within (0, 0.5]")
    if not 0 <= cfg.pbt_mutation_rate <= 1:
        raise ConfigError(f"--pbt_mutation_rate={cfg.pbt_mutation_rate}: must be within [0, 1]")
    if not 1 <= cfg.pbt_perturb_min <= cfg.pbt_perturb_max:
        raise ConfigError(f"--pbt_perturb_min={cfg.pbt_perturb_min}, --pbt_perturb_max={cfg.pbt_perturb_max}: "
                          "need 1 <= min <= max")
    if cfg.pbt_replace_reward_gap < 0 or cfg.pbt_replace_reward_gap_absolute < 0:
        raise ConfigError("--pbt_replace_reward_gap and --pbt_replace_reward_gap_absolute must be 0 or more")
    if not cfg.pbt_target_objective:
        raise ConfigError("--pbt_target_objective: must name an episode metric, e.g. true_objective")


def validate_self_play(cfg: argparse.Namespace) -> None:
    if cfg.self_play_opponents < 0:
        raise ConfigError(f"--self_play_opponents={cfg.self_play_opponents}: must be 0 (no pool) or more")
    if not 0.0 <= cfg.self_play_latest_fraction <= 1.0:
        raise ConfigError(f"--self_play_latest_fraction={cfg.self_play_latest_fraction}: must be within [0, 1]")
    if cfg.self_play_opponents and cfg.num_policies > 1 and not cfg.shared_inference_workers:
        raise ConfigError("--self_play_opponents needs --shared_inference_workers=True with several policies (the "
                          "inference workers of a policy serve its snapshots too)")
    if cfg.policy_mapping is not None:
        from appo.population.matchmaking import MappingError, load_mapping

        try:
            load_mapping(cfg.policy_mapping)
        except MappingError as exc:
            raise ConfigError(str(exc)) from exc


def resolve(cfg: argparse.Namespace, num_agents: int = 1) -> argparse.Namespace:
    """Fill in values that depend on other flags or the env (documented as -1 / auto in --help)."""
    splits = cfg.num_workers * cfg.worker_num_splits
    per_episode = cfg.self_play_opponents > 0 or cfg.policy_mapping is not None  # mappings drawn at episode starts
    if cfg.self_play_opponents and num_agents < 2:
        raise ConfigError(f"--self_play_opponents={cfg.self_play_opponents}: --env={cfg.env} has one agent; self-play "
                          "needs a multi-agent env (num_agents >= 2)")
    if per_episode and cfg.agent_policy_mapping == "split":
        raise ConfigError("--agent_policy_mapping=split gives each split one policy for the whole run; "
                          "--policy_mapping and --self_play_opponents draw per episode: use episode or auto")
    if cfg.agent_policy_mapping == "auto":
        cfg.agent_policy_mapping = ("split" if num_agents == 1 and splits >= cfg.num_policies and not per_episode
                                    else "episode")
    if cfg.agent_policy_mapping == "split" and splits < cfg.num_policies:
        raise ConfigError(f"--agent_policy_mapping=split needs a split per policy: --num_workers * --worker_num_splits"
                          f" = {splits} < --num_policies = {cfg.num_policies}")
    if cfg.recurrence == -1:
        cfg.recurrence = cfg.rollout if cfg.use_rnn else 1
    return cfg


# Sample Factory's --restart_behavior values, as --restart.
RESTART_BEHAVIORS = {"resume": False, "restart": True, "overwrite": True}


def explicit_flags(argv: list[str], parser: argparse.ArgumentParser) -> set[str]:
    """Names (dests) of the flags the user typed on the command line, aliases included (for resume overrides)."""
    dests = {option[2:]: action.dest for action in parser._actions for option in action.option_strings}
    dests["restart_behavior"] = "restart"
    names = set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0]
            names.add(dests.get(name, name))
    return names


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, set[str]]:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    cfg = parser.parse_args(argv)
    behavior = vars(cfg).pop("restart_behavior")
    if behavior is not None:
        cfg.restart = RESTART_BEHAVIORS[behavior]
    if cfg.device == "gpu":
        cfg.device = "cuda"
    validate(cfg)
    return cfg, explicit_flags(argv, parser)


BUILT_IN_ENCODERS = ("auto", "mlp", "nature_cnn", "small_cnn", "impala_resnet")


def validate_encoder(name: str) -> None:
    """Without importing torch: built-in names, `module:factory`, or names registered by a launcher
    (which imported appo.learning.model to call register_encoder)."""
    registered = sys.modules["appo.learning.model"].ENCODERS if "appo.learning.model" in sys.modules else {}
    if name in BUILT_IN_ENCODERS or name in registered or ":" in name:
        return
    raise ConfigError(f"--encoder={name}: unknown; use {', '.join(BUILT_IN_ENCODERS)}, a name registered with "
                      "appo.learning.model.register_encoder, or package.module:factory")


def env_kwargs(cfg: argparse.Namespace) -> dict[str, Any]:
    try:
        kwargs = json.loads(cfg.env_kwargs)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env_kwargs={cfg.env_kwargs}: not valid JSON ({exc})") from exc
    if not isinstance(kwargs, dict):
        raise ConfigError(f"--env_kwargs={cfg.env_kwargs}: must be a JSON object such as '{{\"key\": 1}}'")
    return kwargs


def experiment_dir(cfg: argparse.Namespace) -> str:
    return os.path.join(cfg.train_dir, cfg.experiment)


def load_saved_cfg(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: corrupt or unreadable cfg.json ({exc}); fix it or pass --restart=True") from exc
    if not isinstance(saved, dict) or "env" not in saved:
        raise ConfigError(f"{path}: corrupt cfg.json (not a flag dictionary); fix it or pass --restart=True")
    return saved


def merge_resumed(
    cfg: argparse.Namespace, given: set[str], saved: dict[str, Any]
) -> tuple[argparse.Namespace, list[str]]:
    """Saved flags win unless given again on the command line; returns the merged cfg and override notes."""
    merged = vars(cfg).copy()
    notes = []
    for key, saved_value in saved.items():
        if key not in merged:
            continue
        if key in given:
            if merged[key] != saved_value:
                notes.append(f"--{key}: {saved_value!r} (saved) -> {merged[key]!r} (command line)")
        else:
            merged[key] = saved_value
    merged_cfg = argparse.Namespace(**merged)
    for key in ARCHITECTURE_FLAGS:
        if key in saved and saved[key] != merged[key]:
            raise ConfigError(
                f"--{key}={merged[key]} differs from the saved experiment ({saved[key]}); "
                "it cannot change on resume, pass --restart=True or use another --experiment"
            )
    validate(merged_cfg)
    return merged_cfg, notes


def save_cfg(cfg: argparse.Namespace, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(vars(cfg), f, indent=2, sort_keys=True)
    os.replace(tmp, path)
