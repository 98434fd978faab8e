"""The flag table: every flag of `python -m appo.train`, defined once, as a field of the frozen `Config` (written in
four groups it inherits, each a short read).

A field's annotation is the flag's type; its `flag(...)` gives the default, the `--help` group and text, the
Sample Factory aliases, the choices and the valid range. appo/config/cfg.py makes the parser and `--help` from
this table, appo/config/checks.py checks values against it, and a run's `Config` (the flags after parsing,
validation, resume, the env's defaults and `resolve`) is handed to the runner and to every worker, which reads
its role's view of it (appo/config/views.py). Nothing writes to a `Config`; a changed copy is a new one
(`dataclasses.replace`). Torch-free.
"""

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from appo.config.hyperparams import MUTABLE

# --help groups, in the order --help lists them
EXPERIMENT = "experiment"
SAMPLING = "sampling"
MODEL = "model"
LEARNING = "learning"
PBT = "population-based training (PBT)"
SELF_PLAY = "multi-agent envs and self-play"
BENCHMARK = "benchmarking"
STOPPING = "stopping, checkpoints and reporting"
EVALUATION = "evaluation during training"
TRACKING = "experiment tracking (docs/guide_tracking.md)"

KL_ADAPTIVE_STEP = 1.5  # --lr_schedule=kl_adaptive: the factor the rate moves by after an iteration
# The bounds of its multiple of --learning_rate. Never above 1: allowed up to 10x, the rate rose while a policy barely
# moved (a solved InvertedPendulum, MountainCarContinuous before it finds the flag) and then threw the policy away.
KL_ADAPTIVE_RANGE = (0.01, 1.0)

REQUIRED = object()  # the default of a flag that must be given (--env)
ELO_OBJECTIVE = "elo"  # --pbt_target_objective that ranks by the ratings of games between policies
NO_BUDGET = 10_000_000_000  # the default of --train_for_env_steps and --train_for_seconds: no budget, the run goes on


@dataclass(frozen=True)
class Interval:
    """The values a number flag may take, written as in mathematics: "[0, 1]", "(0, 0.5]", "[1, inf)"."""

    text: str
    low: float
    high: float
    low_closed: bool
    high_closed: bool

    @staticmethod
    def parse(text: str) -> "Interval":
        found = re.fullmatch(r"([\[(])\s*([^,\s]+)\s*,\s*([^\]\s)]+)\s*([\])])", text)
        if found is None:
            raise ValueError(f"{text!r} is not an interval such as '[0, 1]' or '(0, inf)'")
        opening, low, high, closing = found.groups()
        return Interval(text, float(low), float(high), opening == "[", closing == "]")

    def __contains__(self, value: float) -> bool:
        # Written so that NaN is outside every interval.
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def requirement(self, integer: bool, zero: str = "") -> str:
        """What a value must be, as the error message says it: 'must be positive', 'must be within [0, 1]'."""
        if self.high == math.inf:
            if integer and self.low == 1 and self.low_closed:
                return "must be a positive integer"
            if self.low == 0 and not self.low_closed:
                return "must be positive"
            if self.low_closed:
                return f"must be {self.low:g}{f' ({zero})' if zero else ''} or more"
        return f"must be within {self.text}"


@dataclass(frozen=True)
class Flag:
    """How one flag is parsed, checked and explained (the metadata of its `Config` field)."""

    group: str
    help: str  # what the flag does, in one or two sentences
    aliases: tuple[str, ...] = ()  # Sample Factory's names for it
    choices: tuple[str, ...] | None = None
    valid: Interval | None = None
    zero: str = ""  # what 0 means, said in the range error ("must be 0 (no pool) or more")
    details: Callable[[], str] | None = None  # a sentence --help computes from another module's constants


def flag(default: Any, group: str, help: str, *, aliases: tuple[str, ...] = (), choices: tuple[str, ...] | None = None,
         valid: str | None = None, zero: str = "", details: Callable[[], str] | None = None) -> Any:
    """A `Config` field: its default (REQUIRED: none) and its `Flag`."""
    spec = Flag(group, help, aliases, choices, None if valid is None else Interval.parse(valid), zero, details)
    if default is REQUIRED:
        return field(metadata={"flag": spec})
    return field(default=default, metadata={"flag": spec})


def pbt_bounds() -> str:
    """The bounds PBT keeps each hyper-parameter within (appo/config/hyperparams.py MUTABLE), for --with_pbt's help."""
    bounds = ", ".join(f"{name} [{b.low:g}, {b.high:g}] (prior [{b.prior[0]:g}, {b.prior[1]:g}])"
                       for name, b in MUTABLE.items())
    return (f"Mutated, within hard bounds, resampled from priors: {bounds} (gamma only with --pbt_optimize_gamma; "
            "max_grad_norm and exploration_loss_coeff only when not 0).")


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """The experiment (which env, where its files go) and how it samples: workers, envs, inference."""

    # ---------------------------------------------------------------- experiment
    env: str = flag(REQUIRED, EXPERIMENT,
                    "Environment id: anything gymnasium.make accepts, including 'package.module:EnvName-v0'.")
    env_kwargs: str = flag("{}", EXPERIMENT,
                           "JSON object of keyword arguments for the env's make function, e.g. "
                           "'{\"step_seconds\": 0.001}'.")
    experiment: str = flag("default_experiment", EXPERIMENT,
                           "Experiment name; all outputs go to <train_dir>/<experiment>/.")
    train_dir: str = flag("train_dir", EXPERIMENT, "Folder that holds experiment folders.")
    restart: bool = flag(False, EXPERIMENT,
                         "Start the experiment over instead of resuming from its latest checkpoint; the old experiment "
                         "dir is not deleted but renamed to <experiment>_before_restart_<YYYYmmdd-HHMMSS> next to it.")
    seed: int | None = flag(None, EXPERIMENT,
                            "Seeds weights, env resets and action sampling. With one worker, split, policy and "
                            "inference worker the run is then repeatable (the actor waits for each policy update).")
    device: str = flag("auto", EXPERIMENT,
                       "Where inference and learning run: cpu, cuda (or gpu), cuda:N, or auto (cuda when available).")

    # ---------------------------------------------------------------- sampling
    num_workers: int = flag(2, SAMPLING, "Number of actor (rollout) worker processes.", valid="[1, inf)")
    num_envs_per_worker: int = flag(16, SAMPLING, "Environments stepped by each actor worker.", valid="[1, inf)")
    worker_num_splits: int = flag(2, SAMPLING,
                                  "Groups of envs per worker: one group steps while the other waits for actions "
                                  "(double buffering).", valid="[1, inf)")
    batched_sampling: bool = flag(False, SAMPLING,
                                  "Each split of a worker is ONE vectorised env of --num_envs_per_worker / "
                                  "--worker_num_splits sub-envs, stepped in one call, its actions, observations, "
                                  "rewards and episode ends moved as arrays: for envs that step many copies at once "
                                  "faster than one at a time (gymnasium vector entry points such as CartPole-v1's, "
                                  "else a gymnasium SyncVectorEnv). --env=envpool:<task id> is always batched. "
                                  "Single-agent envs only.")
    num_policies: int = flag(1, SAMPLING,
                             "Number of policies trained together; each agent is mapped to a random policy per "
                             "episode.", valid="[1, inf)")
    policy_workers_per_policy: int = flag(1, SAMPLING,
                                          "Inference worker processes per policy; actor w is served by worker w % N, "
                                          "which batches all pending requests of its actors into one forward pass.",
                                          valid="[1, inf)")
    agent_policy_mapping: str = flag("auto", SAMPLING,
                                     "Which policy acts for an env-agent: episode draws one per agent at every episode "
                                     "start; split gives all envs of a split one policy for the whole run (splits "
                                     "dealt round-robin), so a split step needs one forward pass instead of one per "
                                     "policy. auto: split for single-agent envs when every policy gets a split, else "
                                     "episode.", choices=("auto", "episode", "split"))
    shared_inference_workers: bool = flag(True, SAMPLING,
                                          "With several policies, each of the --policy_workers_per_policy inference "
                                          "workers serves every policy (one process, one forward pass per policy); "
                                          "False: that many workers for each policy.")
    rollout: int = flag(32, SAMPLING, "Steps per trajectory sent from actors to the learner.", valid="[1, inf)")
    min_traj_buffers_per_worker: int = flag(2, SAMPLING,
                                            "Trajectory slots per env per worker; more slots let actors run ahead of "
                                            "the learner.", valid="[1, inf)")
    decorrelate_experience_max_seconds: float = flag(0.0, SAMPLING,
                                                     "Each worker waits up to this many seconds before sampling so "
                                                     "workers do not move in lockstep.")
    decorrelate_envs_on_one_worker: bool = flag(True, SAMPLING,
                                                "Take random actions for a random number of steps after the first "
                                                "reset of each env. The episode those steps end in is not reported "
                                                "(its return and length would be partial).")
    set_workers_cpu_affinity: bool = flag(False, SAMPLING,
                                          "Pin each actor worker to one CPU core (round robin). Off by default: with "
                                          "more workers than cores, pinned actors cannot move to a free core when "
                                          "theirs is busy (measured in docs/PERFORMANCE.md).")
    force_envs_single_thread: bool = flag(True, SAMPLING,
                                          "Limit BLAS/OpenMP threads in actor workers to one, so envs do not "
                                          "oversubscribe the cores.")
    backend: str = flag("local", SAMPLING,
                        "Where the workers run. local: every process on this machine. ray: the runner, learners and "
                        "PBT stay on this machine (the head); each Ray node runs a sampler group (actor workers and an "
                        "inference worker per policy) and ships trajectories back through Ray's object store (pip "
                        "install -e \".[ray]\"; docs/cluster.md).", choices=("local", "ray"))
    serial_mode: bool = flag(False, SAMPLING,
                             "Run the actors, inference and learners in the main process, one step of each in "
                             "turn, instead of in processes: a breakpoint in an env or a model stops the run there. "
                             "Slow; for debugging and tests. Local backend only.")
    ray_address: str = flag("", SAMPLING,
                            "With --backend=ray: the cluster to join, as given to ray.init (host:port of the head "
                            "started with 'ray start --head', or auto). Empty: start a Ray instance on this machine "
                            "alone.")
    ray_workers_per_node: int = flag(0, SAMPLING,
                                     "With --backend=ray: actor workers per sampler group (one group per node while "
                                     "nodes are free); --num_workers counts them over the whole cluster. 0: split "
                                     "--num_workers evenly over the nodes that have CPUs.",
                                     valid="[0, inf)", zero="split evenly")
    reset_timeout_seconds: float = flag(120.0, SAMPLING,
                                        "Fail the run if an actor worker cannot create and reset its envs within this "
                                        "many seconds.", valid="(0, inf)")
    stall_timeout_seconds: float = flag(120.0, SAMPLING,
                                        "Fail the run, naming what each worker waits for, if no env step is made for "
                                        "this many seconds (counted from the moment every worker has started).",
                                        valid="(0, inf)")
    env_timeout_seconds: float = flag(60.0, SAMPLING,
                                      "An actor inside one env's step or reset (or making an env) for longer than this "
                                      "is killed and replaced; the log names the worker, the env and the call.",
                                      valid="(0, inf)")
    max_worker_restarts: int = flag(10, SAMPLING,
                                    "A worker (actor, inference worker or learner) that dies is replaced, at most this "
                                    "many times per worker within an hour; one more death stops the run with its "
                                    "cause. 0: stop at the first death.", valid="[0, inf)")
    default_niceness: int = flag(0, SAMPLING, "Niceness (Unix priority) of the worker processes.")
    actor_sched_batch: bool = flag(True, SAMPLING,
                                   "Linux: run actor workers under SCHED_BATCH, so an actor waking from env.step does "
                                   "not preempt the inference worker or learner that every actor waits on (measured "
                                   "in docs/PERFORMANCE.md). Off: the default policy.")
    actor_niceness: int = flag(0, SAMPLING,
                               "Extra niceness of actor workers. With more workers than cores, a few points let "
                               "inference and learner run first (measured in docs/PERFORMANCE.md).", valid="[0, 19]")
    learner_torch_threads: int = flag(1, SAMPLING,
                                      "CPU threads for the learner's torch ops; more helps CPU-only training of CNNs "
                                      "when cores are free.", valid="[1, inf)")
    learner_processes_per_policy: int = flag(
        1, SAMPLING, "Learner processes (ranks) that train each policy together, data-parallel: each takes its share "
        "of every minibatch and torch.distributed sums their gradients (gloo on the CPU; NCCL on CUDA, rank r on "
        "cuda:r). 1: one learner process.", valid="[1, inf)")
    learner_master_addr: str = flag("127.0.0.1", SAMPLING,
                                    "Where each policy's learner ranks meet (torch.distributed's rendezvous, as "
                                    "torchrun's --master_addr): the address of the host of rank 0.")
    learner_master_port: int = flag(0, SAMPLING,
                                    "Where policy p's learner ranks meet: this port + p, or with 0 a free port the "
                                    "system picks for each group (runs at once never collide); pin it for a firewall.",
                                    valid="[0, 65535]")
    learner_bf16: bool = flag(False, SAMPLING,
                              "On a CPU, the learner runs image encoders under bfloat16 autocast (heads, losses and "
                              "weights stay float32), for faster SGD (docs/PERFORMANCE.md). No effect on CUDA or on "
                              "vector observations.")
    inference_bf16: bool = flag(False, SAMPLING,
                                "On a CPU, inference workers run image encoders in bfloat16 (a bfloat16 copy of "
                                "their weights, made once per weight version), for faster forward passes "
                                "(docs/PERFORMANCE.md); actions are sampled from float32 outputs. No effect on CUDA or "
                                "on vector observations.")
    max_policy_lag: int = flag(100, SAMPLING,
                               "Trajectories collected by a policy more than this many versions old are dropped and "
                               "counted.", valid="[0, inf)")


@dataclass(frozen=True, kw_only=True)
class LearningFlags:
    """The model and how the learner trains it."""

    # ---------------------------------------------------------------- model
    encoder: str = flag("auto", MODEL,
                        "Observation encoder: auto (mlp for vectors; for images nature_cnn, or small_cnn (3x3 "
                        "convolutions) when a side is under 36 pixels; said at start-up), mlp, nature_cnn, small_cnn, "
                        "impala_resnet (a CNN named here takes the images and the MLP a Dict's vectors), a name "
                        "registered with appo.learning.model.register_encoder, or "
                        "package.module:factory.")
    action_mask: str = flag("auto", MODEL,
                            "Which actions each step allows: auto (the 'action_mask' key of a Dict observation, as "
                            "PettingZoo's classic games give it, when there is one), info (info['action_mask'] of "
                            "each reset and step), info:KEY (another info key), or none (no masking; an "
                            "'action_mask' key is then an ordinary observation). A mask holds one 0/1 per choice of a "
                            "Discrete action, or of each part of a MultiDiscrete one, in order; disallowed actions "
                            "get probability 0 when sampling, training, evaluating and in exported models.")
    mirror_symmetry: bool = flag(False, MODEL,
                                 "The env is the same mirrored left to right, its Discrete actions being the columns "
                                 "of its image observations (connect four): the policy and value are averaged over "
                                 "each observation and its mirror image, so what is learned on one side holds on the "
                                 "other, for a second forward pass of every batch. Feed-forward models only.")
    actor_critic_share_weights: bool = flag(True, MODEL,
                                            "One encoder (and core) for policy and value heads; False gives the critic "
                                            "its own.")
    normalize_input: bool = flag(True, MODEL,
                                 "Normalise float observations by running mean/std (kept by the learner, used by "
                                 "inference); uint8 images are scaled to [0, 1] either way.")
    normalize_returns: bool = flag(True, MODEL,
                                   "Learn values in units of the running mean/std of the value targets (with PopArt's "
                                   "output preservation), so no --reward_scale has to be tuned to the task's reward "
                                   "sizes.")
    initial_stddev: float = flag(1.0, MODEL,
                                 "Standard deviation of the Gaussian of continuous actions before training; learned "
                                 "from there as one parameter per dimension that does not depend on the observation. "
                                 "The Gaussian starts at the action box's centre, and a dimension whose box is "
                                 "narrower either side than this std starts at its half width (sampled actions are "
                                 "clipped to the box); dimensions of zero width or with an infinite bound keep this "
                                 "std.", valid="[0.01, 7]")
    hidden_size: int = flag(64, MODEL, "Width of the MLP encoder layers and of the RNN core.", aliases=("rnn_size",),
                            valid="[1, inf)")
    mlp_layers: int = flag(2, MODEL, "Number of hidden layers in the MLP encoder.", valid="[0, inf)")
    use_rnn: bool = flag(False, MODEL, "Use a recurrent core after the encoder.")
    rnn_type: str = flag("gru", MODEL, "Type of the recurrent core: a GRU or an LSTM cell.", choices=("gru", "lstm"))
    recurrence: int = flag(-1, MODEL,
                           "Back-propagation through time length; must divide --rollout. -1: --rollout with RNN, "
                           "else 1.")

    # ---------------------------------------------------------------- learning
    batch_size: int = flag(256, LEARNING, "Samples (env steps) per SGD minibatch.", valid="[1, inf)")
    num_batches_per_iteration: int = flag(8, LEARNING,
                                          "Minibatches per training iteration; an iteration uses batch_size * this "
                                          "many fresh samples.", aliases=("num_batches_per_epoch",), valid="[1, inf)")
    ppo_epochs: int = flag(4, LEARNING, "Passes (epochs) over each iteration's samples; with --adaptive_epochs the "
                           "most an iteration trains.", aliases=("num_epochs",), valid="[1, inf)")
    adaptive_epochs: bool = flag(False, LEARNING,
                                 "Train the passes after the first only while the next iteration's trajectories are "
                                 "not all in: a learner slower than the sampler trains fewer passes instead of holding "
                                 "it back. Faster by the clock where the learner is the limit, but the passes then "
                                 "follow the machine's speed, so the same command learns differently on a faster, "
                                 "slower or busier machine. The passes trained show in the status line and summaries "
                                 "(learner/epochs). False: always --ppo_epochs.")
    num_minibatches_to_accumulate: int = flag(2, LEARNING,
                                              "When more minibatches than this wait at a learner, actors pause "
                                              "collecting for that policy.", valid="[1, inf)")
    ppo_clip_ratio: float = flag(0.1, LEARNING, "PPO clip e: the ratio is clipped to [1/(1+e), 1+e].",
                                 valid="(0, inf)")
    ppo_clip_value: float = flag(1.0, LEARNING,
                                 "Value updates are clipped to this distance from the values at collection time.",
                                 valid="(0, inf)")
    with_vtrace: bool = flag(False, LEARNING,
                             "Use V-trace targets and advantages (off-policy corrected) instead of GAE.")
    vtrace_rho: float = flag(1.0, LEARNING, "V-trace rho-bar: clip of importance weights in targets.")
    vtrace_c: float = flag(1.0, LEARNING, "V-trace c-bar: clip of the trace-cutting coefficients.")
    gae_lambda: float = flag(0.95, LEARNING, "GAE lambda (used when --with_vtrace=False).", valid="[0, 1]")
    gamma: float = flag(0.995, LEARNING, "Discount factor of future rewards.", valid="(0, 1]")
    normalize_advantage: bool = flag(True, LEARNING,
                                     "Normalise advantages to zero mean and unit std within each minibatch.")
    recompute_advantages: bool = flag(False, LEARNING,
                                      "Compute GAE's advantages and value targets again at the start of every pass "
                                      "from the value head's current weights, instead of once from the values "
                                      "inference stored (the behaviour policy's, up to --max_policy_lag versions "
                                      "old). One more forward pass over the iteration's samples a pass. GAE only "
                                      "(--with_vtrace=False, whose targets already use the current values).")
    minibatch_unit: str = flag("auto", LEARNING,
                               "What the passes' minibatches are drawn from once GAE is done: step (single steps "
                               "of any trajectory, as CleanRL and stable-baselines3 draw theirs) or trajectory "
                               "(whole trajectories of --rollout steps, whose steps follow one another and are "
                               "alike; a recurrent model and V-trace need them). auto: step for a feed-forward model "
                               "without V-trace, trajectory otherwise.", choices=("auto", "step", "trajectory"))
    value_bootstrap: bool = flag(True, LEARNING,
                                 "On time-limit truncation add gamma * V(s) to the last reward instead of treating it "
                                 "as death.")
    reward_scale: float = flag(1.0, LEARNING,
                               "Rewards are multiplied by this before learning (and before --reward_clip); with "
                               "--normalize_returns=False it keeps value targets near 1-10, so the value loss does not "
                               "dominate.", valid="(0, inf)")
    reward_clip: float = flag(1000.0, LEARNING, "Scaled rewards are clipped to [-x, x].", valid="(0, inf)")
    learning_rate: float = flag(1e-3, LEARNING, "Learning rate of the Adam optimizer.", valid="(0, inf)")
    lr_schedule: str = flag("kl_adaptive", LEARNING,
                            "How the learning rate moves over the run: constant; linear: down from --learning_rate "
                            "to 0 at --train_for_env_steps (the policy's own env steps; needs that budget); "
                            f"kl_adaptive: after each iteration, down {KL_ADAPTIVE_STEP}x when its minibatches' mean "
                            "KL from the weights it started with was over twice --lr_schedule_kl_threshold, back up as "
                            f"much when under half of it, from {KL_ADAPTIVE_RANGE[0]:g}x --learning_rate to "
                            "--learning_rate itself (one more forward pass over the iteration's samples, none where an "
                            "iteration is one update, whose KL is measured before it; the policy lag of an "
                            "asynchronous run, which the machine's speed sets, is not counted).",
                            choices=("constant", "linear", "kl_adaptive"))
    lr_schedule_kl_threshold: float = flag(0.01, LEARNING,
                                           "The KL per iteration --lr_schedule=kl_adaptive steers the learning rate "
                                           "towards.", valid="(0, inf)")
    adam_eps: float = flag(1e-6, LEARNING, "Adam's epsilon, added to the denominator for numerical stability.",
                           valid="(0, inf)")
    adam_beta1: float = flag(0.9, LEARNING, "Adam's beta1: the decay rate of its running mean of gradients.",
                             valid="[0, 1)")
    adam_beta2: float = flag(0.999, LEARNING, "Adam's beta2: the decay rate of its running mean of squared gradients.",
                             valid="[0, 1)")
    max_grad_norm: float = flag(4.0, LEARNING, "Gradient norm clipping threshold; 0 disables it.", valid="[0, inf)",
                                zero="no clipping")
    exploration_loss: str = flag("entropy", LEARNING,
                                 "Exploration bonus: policy entropy, or symmetric KL to a prior: uniform for "
                                 "discrete actions, normal with std 1 at the action box's centre for continuous ones.",
                                 choices=("entropy", "symmetric_kl"))
    exploration_loss_coeff: float = flag(0.003, LEARNING, "Weight of the exploration loss.", valid="[0, inf)")
    kl_loss_coeff: float = flag(0.0, LEARNING,
                                "Weight of a penalty on the KL divergence of the policy from the behaviour policy, "
                                "estimated from the sampled actions (mean of r - 1 - log r, r the probability ratio): "
                                "it holds back the samples PPO's clip has stopped training. 0 turns it off.",
                                valid="[0, inf)")
    proximal_policy: str = flag("behaviour", LEARNING,
                                "The policy PPO's clip range is measured from. behaviour: the one that acted (the "
                                "classic ratio; in an asynchronous run its weights are up to --max_policy_lag "
                                "versions old, so part of the clip range is spent before an iteration starts). "
                                "iteration: the weights at the start of the iteration (one more forward pass over its "
                                "samples), the gap from the behaviour policy corrected by an importance weight "
                                "(decoupled PPO, Hilton et al. 2021). GAE only (--with_vtrace=False).",
                                choices=("behaviour", "iteration"))
    value_loss_coeff: float = flag(0.5, LEARNING, "Weight of the value loss.", valid="(0, inf)")


@dataclass(frozen=True, kw_only=True)
class PopulationFlags:
    """Several policies: population-based training, multi-agent envs and self-play."""

    # ---------------------------------------------------------------- population-based training (PBT)
    with_pbt: bool = flag(False, PBT,
                          "Evolve the --num_policies policies while they train: every period, a policy ranked in the "
                          "bottom fraction by its objective takes over the weights, optimizer state and "
                          "hyper-parameters of a top one and explores from them (resamples or perturbs a few of its "
                          "hyper-parameters and the env's reward shaping); a bottom one with no top one far enough "
                          "ahead explores from its own; the rest keep theirs.", details=pbt_bounds)
    pbt_period_env_steps: int = flag(25_000, PBT,
                                     "Env steps of its own between two PBT decisions about a policy. The defaults of "
                                     "the --pbt_* flags suit runs of minutes on a workstation "
                                     "(docs/pbt_suite.md); runs of billions of steps want longer periods and "
                                     "smaller perturbations (Sample Factory: 5M steps, 0.15, [1.1, 1.5]).",
                                     valid="[1, inf)")
    pbt_start_mutation: int = flag(25_000, PBT,
                                   "No PBT decision about a policy before it has taken this many env steps.",
                                   valid="[0, inf)")
    pbt_replace_fraction: float = flag(0.3, PBT,
                                       "Fraction of the population (rounded up, at most half) forming the top that is "
                                       "copied and the bottom that is replaced.", valid="(0, 0.5]")
    pbt_mutation_rate: float = flag(0.15, PBT,
                                    "Probability that each hyper-parameter and shaping coefficient moves when a policy "
                                    "explores (one at random when none was chosen, so an explore always moves one). "
                                    "Low so that values far off are fixed without walking good ones away.",
                                    valid="[0, 1]")
    pbt_resample_probability: float = flag(0.5, PBT,
                                           "Probability that a value chosen to move is drawn anew from its prior (see "
                                           "--with_pbt's bounds; a shaping coefficient only when the env declares its "
                                           "range) instead of perturbed: one draw takes a value 100x off back to a "
                                           "sane range (a model of PBT, scripts/pbt_simulate.py at e9777ba: from a "
                                           "learning rate 100x too low, 0.5 solves where 0.25 often does not).",
                                           valid="[0, 1]")
    pbt_replace_reward_gap: float = flag(0.1, PBT,
                                         "A bottom policy is replaced only if the top one's objective exceeds its own "
                                         "by this fraction of the larger magnitude of the two (works for negative "
                                         "returns too), by more than --pbt_replace_reward_gap_absolute, and by "
                                         "--pbt_replace_confidence standard errors (their episodes' noise). Not "
                                         "for --pbt_target_objective=elo: see --pbt_replace_elo_gap.",
                                         valid="[0, inf)")
    pbt_replace_reward_gap_absolute: float = flag(1e-6, PBT,
                                                  "The least amount by which the top policy's objective must exceed a "
                                                  "bottom one's for a replacement (see --pbt_replace_reward_gap).",
                                                  valid="[0, inf)")
    pbt_replace_elo_gap: float = flag(100.0, PBT,
                                      "With --pbt_target_objective=elo, a bottom policy is replaced only if the top "
                                      "one's rating exceeds its own by more than this many Elo points, whatever the "
                                      "rating level (a rating has no natural zero for a relative gap; what 100 points "
                                      "mean: docs/population.md).", valid="[0, inf)")
    pbt_replace_confidence: float = flag(2.0, PBT,
                                         "A replacement also needs the top policy's objective ahead by this many "
                                         "standard errors of the difference of the two means (each over --stats_avg "
                                         "episodes), so that a lead is not noise; 0: the gaps alone.", valid="[0, inf)")
    pbt_optimize_gamma: bool = flag(False, PBT, "Let PBT mutate the discount factor too.")
    pbt_perturb_min: float = flag(1.2, PBT,
                                  "A perturbed value is multiplied or divided (even odds) by a factor drawn from "
                                  "[--pbt_perturb_min, --pbt_perturb_max]; gamma and GAE lambda move on 1 - x.")
    pbt_perturb_max: float = flag(2.0, PBT,
                                  "See --pbt_perturb_min. Small steps tune a value; a value far off is left by "
                                  "resampling (--pbt_resample_probability).")
    pbt_target_objective: str = flag("true_objective", PBT,
                                     "What PBT ranks by, averaged over --stats_avg episodes: true_objective is the "
                                     "env's info['true_objective'] at an episode's end, or the episode return without "
                                     "it; any other name is a numeric value in the info of an episode's last step, or "
                                     "in its info['episode_extra_stats']; elo is the policy's Elo rating from the "
                                     "games between policies and their self-play snapshots (for zero-sum games, where "
                                     "returns average 0), once it has played --stats_avg of them. Never the shaped "
                                     "reward.")
    pbt_mix_policies_in_one_env: bool = flag(True, PBT,
                                             "Multi-agent envs: draw a policy per agent; False: one policy for all "
                                             "agents of an env.")

    # ---------------------------------------------------------------- multi-agent envs and self-play
    policy_mapping: str | None = flag(None, SELF_PLAY,
                                      "A package.module:function that decides the policies of an episode: "
                                      "function(num_agents, num_policies, rng) returns one policy id per agent, called "
                                      "at every episode start (rng: a numpy Generator). Default: a uniform draw per "
                                      "agent (per env with --pbt_mix_policies_in_one_env=False).")
    self_play_opponents: int = flag(0, SELF_PLAY,
                                    "Self-play with an opponent pool: keep this many frozen snapshots of each policy, "
                                    "served by the inference workers; in an episode one random seat plays the policy "
                                    "and learns, the others its latest self or one snapshot. Multi-agent envs only; 0: "
                                    "no pool (agents play the mapped policies).", valid="[0, inf)", zero="no pool")
    self_play_snapshot_every: int = flag(100, SELF_PLAY,
                                         "Policy versions (training iterations) between two snapshots; the newest "
                                         "replaces the oldest.", valid="[1, inf)")
    self_play_latest_fraction: float = flag(0.5, SELF_PLAY,
                                            "Fraction of episodes in which the opponents are the policy's latest self "
                                            "rather than a snapshot drawn uniformly from its pool (always the latest "
                                            "self until the first snapshot exists).", valid="[0, 1]")
    random_opening_moves: int = flag(0, SELF_PLAY,
                                     "Turn-based games (PettingZoo AEC envs) only: each training game starts after a "
                                     "random number, 0 to this, of uniformly random legal moves, so self-play meets "
                                     "positions off its own lines of play (evaluation, enjoy and versus play whole "
                                     "games).", valid="[0, inf)", zero="every game from the start")


@dataclass(frozen=True, kw_only=True)
class OutputFlags:
    """When a run stops and what it leaves: benchmarking, checkpoints, reports, evaluation, trackers."""

    # ---------------------------------------------------------------- benchmarking
    benchmark: bool = flag(False, BENCHMARK,
                           "Run a fixed budget and print a throughput table (frames/s, time shares, bottleneck); also "
                           "written to benchmark.json in the experiment dir.")
    benchmark_env_steps: int = flag(2_000_000, BENCHMARK,
                                    "Env steps after which a benchmark stops, counted once every actor is sampling.",
                                    valid="[1, inf)")
    benchmark_samples: int = flag(1_000_000, BENCHMARK,
                                  "Trained samples after which a benchmark stops (whichever budget comes first).",
                                  valid="[1, inf)")
    benchmark_raw_limit_s: float = flag(5.0, BENCHMARK,
                                        "Seconds of a benchmark's raw limit, measured before the trainer starts: one "
                                        "plain process per core stepping a worker's envs with random actions, nothing "
                                        "else. The table shows it beside the trainer's frames/s, and the fraction. 0: "
                                        "not measured; --backend=ray never measures it (its cores are elsewhere).",
                                        valid="[0, inf)")
    sampler_only: bool = flag(False, BENCHMARK,
                              "Actors and inference run, trajectories are recycled without learning: measures the "
                              "sampler alone.")

    # ---------------------------------------------------------------- stopping, checkpoints and reporting
    train_for_env_steps: int = flag(NO_BUDGET, STOPPING, "Stop after this many env steps.", valid="[1, inf)")
    train_for_seconds: float = flag(NO_BUDGET, STOPPING, "Stop after this many seconds of this session.",
                                    valid="(0, inf)")
    target_reward: float | None = flag(None, STOPPING,
                                       "Stop (and mark done) once a policy's mean reward over the last --stats_avg "
                                       "episodes reaches this (counted once every env has ended an episode: the "
                                       "first to end are the short ones).")
    target_objective: float | None = flag(None, STOPPING,
                                          "Stop (and mark done) once a policy's mean objective (see "
                                          "--pbt_target_objective) over the last --stats_avg episodes reaches this, "
                                          "e.g. a goal rate that the shaped reward does not show.")
    save_every_sec: float = flag(60.0, STOPPING,
                                 "Seconds between periodic checkpoints: what a crash of the main process (or the "
                                 "machine) can lose. A learner that dies alone loses only the iteration it was "
                                 "training.", valid="(0, inf)")
    keep_checkpoints: int = flag(3, STOPPING, "Checkpoints kept per policy; older ones are deleted.", valid="[1, inf)")
    experiment_summaries_interval: float = flag(10.0, STOPPING, "Seconds between tensorboard summary writes.",
                                                valid="(0, inf)")
    report_interval: float = flag(5.0, STOPPING, "Seconds between printed status lines.", valid="(0, inf)")
    stats_avg: int = flag(100, STOPPING, "Episodes averaged in reported mean reward and length.", valid="[1, inf)")

    # ---------------------------------------------------------------- evaluation during training
    eval_every_env_steps: int = flag(0, EVALUATION,
                                     "Every this many env steps of a policy, play --eval_episodes deterministic "
                                     "episodes (most likely action) with its newest weights on envs of their own, in "
                                     "one low-priority evaluator process; the results go to tensorboard (eval/) and "
                                     "the status line. 0: no evaluation.", valid="[0, inf)", zero="no evaluation")
    eval_episodes: int = flag(10, EVALUATION, "Episodes played per evaluation.", valid="[1, inf)")
    save_best_metric: str = flag("reward", EVALUATION,
                                 "Evaluation result that picks a policy's best weights, kept as "
                                 "checkpoint_p<policy>/best.pth apart from the rolling checkpoints (higher is better): "
                                 "reward (the mean return), or an episode metric the env reports in "
                                 "info['episode_extra_stats'].")

    # ---------------------------------------------------------------- experiment tracking
    with_jsonl: bool = flag(False, TRACKING,
                            "Also write every summary to <experiment>/metrics.jsonl: one JSON object a line per policy "
                            "and write, {\"policy\", \"env_steps\", \"wall_time\", then each tensorboard tag and its "
                            "value} (docs/guide_tracking.md). Needs nothing installed.")
    with_wandb: bool = flag(False, TRACKING,
                            "Also send the summaries, the config and, at the end, the learning curve to Weights & "
                            "Biases (pip install -e \".[wandb]\"), from a thread of their own: a tracker that fails "
                            "stops alone, training goes on. The run folder is <experiment>/wandb/; a resumed "
                            "experiment continues the same W&B run (docs/guide_tracking.md).")
    wandb_user: str | None = flag(None, TRACKING, "W&B entity (user or team) of the run; default: your default "
                                  "entity.")
    wandb_project: str = flag("appo", TRACKING, "W&B project of the run.")
    wandb_group: str | None = flag(None, TRACKING, "W&B group of the run, e.g. to see the seeds of one setting "
                                   "together.")
    wandb_job_type: str | None = flag(None, TRACKING, "W&B job type of the run.")
    wandb_tags: str = flag("", TRACKING,
                           "W&B tags of the run, separated by commas (from Python, a list of strings).")
    wandb_mode: str = flag("auto", TRACKING,
                           "Where the W&B run goes: online to the W&B server as the run goes; offline into the run "
                           "folder only, for 'wandb sync' later; auto: WANDB_MODE when set, else online when an API "
                           "key is configured (WANDB_API_KEY or a netrc entry for the W&B host, as 'wandb login' "
                           "writes), else offline.",
                           choices=("auto", "online", "offline"))
    with_mlflow: bool = flag(False, TRACKING,
                             "Also send the summaries (at the env steps of each policy), the config (as params and as "
                             "cfg.json) and, at the end, the learning curve to MLflow (pip install -e \".[mlflow]\"), "
                             "from a thread of their own: a tracker that fails stops alone, training goes on. The run "
                             "is named after --experiment; a resumed experiment continues the same MLflow run "
                             "(docs/guide_tracking.md).")
    mlflow_tracking_uri: str | None = flag(None, TRACKING,
                                           "Where MLflow keeps the runs: a server (http://host:port) or a database. "
                                           "Default: sqlite:///<train_dir>/mlflow.db, its artifacts in "
                                           "<train_dir>/mlartifacts (mlflow ui --backend-store-uri shows them).")
    mlflow_experiment: str | None = flag(None, TRACKING,
                                         "MLflow experiment that holds the run; default: the name of the --train_dir "
                                         "folder, so the experiments of one train_dir are runs side by side.")


@dataclass(frozen=True, kw_only=True)
class Config(OutputFlags, PopulationFlags, LearningFlags, RunFlags):
    """Every flag of a run, typed, after parsing, validation, resume, the env's defaults and `resolve`
    (appo/config/cfg.py). Each field's `flag(...)` says what it does; `python -m appo.train --help` prints it. The
    fields are those of the four groups above; a dataclass takes its bases' fields from the last base to the first,
    so they run from --env to the trackers."""


# Accepted on the command line only and never saved: Sample Factory's spelling of --restart.
RESTART_BEHAVIORS = {"resume": False, "restart": True, "overwrite": True}
RESTART_BEHAVIOR = Flag(EXPERIMENT,
                        "Sample Factory's name for --restart: resume is False, restart and overwrite are True (the old "
                        "experiment is renamed aside; nothing is ever deleted).",
                        choices=tuple(sorted(RESTART_BEHAVIORS)))
COMMAND_LINE_ONLY = {"restart_behavior": RESTART_BEHAVIOR}

FLAG_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Config))


def spec(name: str) -> Flag:
    """The `Flag` of a field of `Config`, or of a command-line-only flag."""
    if name in COMMAND_LINE_ONLY:
        return COMMAND_LINE_ONLY[name]
    return Config.__dataclass_fields__[name].metadata["flag"]


def value_type(name: str) -> tuple[type, bool]:
    """The type of a flag's values (bool, int, float or str), and whether it may be None."""
    annotation = Config.__dataclass_fields__[name].type
    kinds = getattr(annotation, "__args__", (annotation,))
    return next(t for t in kinds if t is not type(None)), type(None) in kinds
