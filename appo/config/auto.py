"""Defaults chosen from the task, for the flags a new experiment was not given.

The defaults in --help suit vector observations and cheap envs (CartPole, LunarLander, Pendulum, MuJoCo). At the
start of a new experiment the rules below look at what the env is, its observation space and the measured cost of
one step, and replace a default where the task needs another value. A flag typed on the command line (or passed
to `appo.train()`) always wins. Each choice is logged once as "auto: ..." and saved in cfg.json, so a resumed
run keeps it. The measurements behind the rules are in docs/PERFORMANCE.md ("Defaults that adapt").

- Encoder (`--encoder=auto`): mlp for vectors; nature_cnn for images, small_cnn when a side is under 36 pixels.
- Images: a CNN's SGD on a CPU is the bottleneck, so every sample is trained on once, in minibatches of
  --batch_size, at a lower learning rate and with Atari's usual discount and exploration bonus (IMAGE_LEARNING).
  Small images (every side of every image under the Nature CNN's 36 pixels: MinAtar's 10x10 grids, boards) keep
  --ppo_epochs passes, as vectors do (SMALL_IMAGE_KEEPS): the small CNN costs a fraction of the Nature CNN a sample,
  and one pass left most of what its samples teach unlearned: at 1M env steps, seeds 0-2 in one sitting, MinAtar
  Seaquest 16.2 against 1.9 and Breakout 15.3 against 8.7, in about 4 times the wall time; catch reaches 9 in half
  the env steps and 1.9 times the seconds (docs/PERFORMANCE.md).
- Continuous actions only (every part a Box): no entropy bonus (CONTINUOUS_LEARNING). The Gaussian's learned std
  does the exploring, and a bonus on it keeps the std wide, so returns plateau (images included).
- Continuous actions on vector observations (CONTINUOUS_VECTORS): the critic gets an MLP of its own. With one trunk
  the value loss shapes the features the policy's mean reads; on MuJoCo's Hopper every seed then settled on standing
  still (1,000 steps of alive bonus), with two trunks seeds 0 and 1 hopped to over 3,000 at 1M steps. Images keep
  one trunk: a second CNN would double the SGD that already bounds them. (PPO's clip range at 0.2 for these tasks
  was tried and left out: docs/performance_log.md, third sitting of 2026-11-26.)
- An env that gives an action mask in its reset's info (`info["action_mask"]`, gymnasium's Taxi) rather than in its
  observation gets `--action_mask=info`: the mask then joins the observation (appo/envs/action_masks.py) and its
  disallowed actions are never sampled. Taxi at 1M env steps (3 seeds) went from -200 at every seed (the time limit's
  return: illegal pick-ups and drop-offs cost 10 each, and the policy learned to avoid the two actions altogether,
  rides included) to a mean of 7.89.
- A turn-based game (a PettingZoo AEC env) starts each training game after 0 to N uniformly random legal moves
  (`random_openings`, `--random_opening_moves`), N being OPENING_SHARE of the game's mean length under random play
  (probed at start-up over GAME_PROBE_MOVES moves, appo.envs.registry.random_game_moves): self-play alone keeps to
  its own lines of play, and a player from elsewhere leads it off them. Tic-tac-toe (N = 2) with the guide's flags,
  300 s, seeds 0-2 in one sitting: 12, 35 and 18 of 100 games lost to a perfect player without openings, none with
  them. Connect four (N = 6), 10 minutes, seeds 0-2, alternating with N = 2 in one sitting: 58.0% against the
  one-step lookahead, 57.6% with N = 2, 99.2% and 98.3% against random (docs/guide_turn_based.md).
- Numerics are float32 unless `--learner_bf16` or `--inference_bf16` is given: bfloat16 rounds differently, so a
  choice made by timing it would learn differently on a faster or slower CPU. Images on a CPU with native bfloat16
  (AVX512-BF16, AMX) that learns and infers (--device=cpu, or auto where torch sees no CUDA device) get a line that
  names the flags: on one Xeon bfloat16 ran the CNN faster, on another listing the same flags slower
  (docs/PERFORMANCE.md; scripts/bench_cnn.py measures both on this machine). On CUDA the flags do nothing.
- Continuous actions on vectors where the noise of std 1 ends no episode early (HalfCheetah, Swimmer, Pusher, Reacher:
  only a time limit ends them), or ends at least twice as many early as the narrow noise below would (probed at
  start-up for NOISE_PROBE_STEPS steps of each, however long they take, appo.envs.registry.noise_terminations): the
  Gaussian starts at std 1/sqrt(action dimensions) (narrow_start), so the noise vector's expected squared length is 1
  at any number of dimensions, as a single action's is at the default std of 1. From 6 unit noises (a third of each
  dimension's samples clipped at the bounds) HalfCheetah settled on a slow gait at every seed (1,380 at 1M steps, 3
  seeds); from std 0.5 every seed ran (4,255). Ant ends 20 episodes in 2,000 steps of std 1 (it tips over or jumps out
  of its healthy height) and 4 at std 1/sqrt(8): the wide noise itself ended its episodes, and from the narrow start
  it reached 1,238 at 1M steps (3 seeds) where std 1 gave 219. A single action keeps std 1: MountainCarContinuous
  needs that noise to reach its goal at all (from std 0.5 no seed of 3 did in 300 s, and the policy stopped moving).
  Where a body falls whatever the noise (Hopper, Walker2d, Humanoid, BipedalWalker: 0.7 to 1 times as many early ends
  at the narrow std) the std stays 1: from a narrow start Hopper learned to stand still for the alive bonus (1,849
  over 5 seeds at std 0.5 against 2,823 at 1). This std, chosen or given, is the model's scalar: the model itself
  centres the Gaussian on the action box and caps each dimension's std at its half width (appo.spaces.initial_stds),
  as sampled actions are clipped to the box: std 1 on Humanoid's [-0.4, 0.4] puts 69% of each dimension's samples on a
  bound, std 0.4 puts 32%, as std 1 does on [-1, 1]. `box_start` says so in an auto line where the box changes the
  start.
- Env steps of at least COSTLY_STEP_S (timed at start-up; the line gives the time): sampling limits the run. A CNN's
  forward pass costs less per observation in bigger batches, so each forward pass of an inference worker should see
  about INFERENCE_BATCH observations: a split gets INFERENCE_BATCH / (actors per inference worker x agents per env)
  envs, within ENVS_PER_SPLIT (at least 1 for a multi-agent env: a Doom match is already 2 engines and 2 processes).
  Actors also get `--actor_niceness=COSTLY_ACTOR_NICENESS`, so the inference worker they all wait on runs first.
  Cheaper envs keep the default 16 per worker: their sampler outruns the learner already, and more envs only add
  policy lag. With batched sampling of a natively vectorised env the cost is one sub-env's share of a vectorised step
  (appo.envs.vector.sub_env_step_seconds), so EnvPool's Atari is sized as costly like ALE's.
- Batched sampling of a natively vectorised env on vector observations (EnvPool, a gymnasium vector entry point such
  as CartPole's: sub-envs stepped in one native call, not one after another in Python): the sampler outruns a CPU
  learner at the defaults, so the learner takes bigger minibatches at a learning rate scaled with them, and the splits
  more sub-envs, so an iteration's trajectories come from more episodes (FAST_BATCHED). Keyed on how the env is
  vectorised, not on a timing, so every machine learns with the same values: to threshold against the defaults it
  won on CartPole, EnvPool's Acrobot and Pendulum, and at 500k env steps on EnvPool's HalfCheetah, Hopper and
  LunarLander it was within the seeds' spread (docs/PERFORMANCE.md). A SyncVectorEnv of Python sub-envs is excluded:
  there the same values lost (Acrobot).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from appo.config.flags import Config
from appo.envs import EnvInfo
from appo.envs.registry import GAME_PROBE_MOVES, NOISE_PROBE_STEPS
from appo.envs.vector import natively_vectorised, steps_batched
from appo.spaces import (
    MASK_KEY,
    NATURE_CNN_MIN_SIZE,
    action_spec,
    auto_encoder,
    gaussian_box,
    image_side,
    initial_stds,
    is_image,
    mask_size,
    obs_spaces,
)
from appo.utils.resources import cuda_device_count

COSTLY_STEP_S = 1e-4
INFERENCE_BATCH = 32
ENVS_PER_SPLIT = (4, 16)  # the bounds of that sizing
COSTLY_ACTOR_NICENESS = 5
NARROW_EARLY_ENDS = 0.5  # the narrow start where its noise ends at most this share of std 1's early ends
FAST_BATCHED = {"batch_size": 512, "learning_rate": 2e-3}
FAST_BATCHED_ENVS_PER_SPLIT = 32

IMAGE_LEARNING = {"ppo_epochs": 1, "num_batches_per_iteration": 1, "learning_rate": 5e-4, "gamma": 0.99,
                  "exploration_loss_coeff": 0.01}
SMALL_IMAGE_KEEPS = ("ppo_epochs",)  # the IMAGE_LEARNING flags small images leave at their default

CONTINUOUS_LEARNING = {"exploration_loss_coeff": 0.0}

CONTINUOUS_VECTORS = {"actor_critic_share_weights": False}

# A turn-based game's openings: up to this share of a random game's moves (tic-tac-toe 2 of 7.7, connect four 6 of
# 20.8), at least one; FALLBACK_OPENING_MOVES where the probe failed.
OPENING_SHARE = 0.3
FALLBACK_OPENING_MOVES = 2


def flag_help(name: str) -> str:
    """The sentence --help adds to a flag these rules may set (empty for the others)."""
    rules = []
    if name in IMAGE_LEARNING:
        small = f" with every side {NATURE_CNN_MIN_SIZE} pixels or more" if name in SMALL_IMAGE_KEEPS else ""
        rules.append(f"{IMAGE_LEARNING[name]:g} for image observations{small}")
    if name in CONTINUOUS_LEARNING:
        rules.append(f"{CONTINUOUS_LEARNING[name]:g} for continuous (Box) actions, images or not")
    if name in CONTINUOUS_VECTORS:
        rules.append(f"{CONTINUOUS_VECTORS[name]} for continuous (Box) actions on vector observations")
    if name == "initial_stddev":
        rules.append(f"1/sqrt(action dimensions) for continuous (Box) actions on vector observations where "
                     f"{NOISE_PROBE_STEPS} steps of noise at std 1 end no episode early, or end over "
                     f"{1 / NARROW_EARLY_ENDS:g} times as many as at that std (at start-up, however long they take)")
    if name == "num_envs_per_worker":
        rules.append(f"for env steps of {COSTLY_STEP_S * 1e3:g} ms or more (measured at start-up), {INFERENCE_BATCH} / "
                     f"(actors per inference worker x agents per env) per split, within {list(ENVS_PER_SPLIT)} "
                     "(from 1 for multi-agent envs)")
    if name in FAST_BATCHED or name == "num_envs_per_worker":
        value = FAST_BATCHED.get(name, f"{FAST_BATCHED_ENVS_PER_SPLIT} per split")
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        rules.append(f"{shown} with batched sampling of a natively vectorised env (EnvPool, a gymnasium vector "
                     "entry point) on vector observations")
    if name == "random_opening_moves":
        rules.append(f"for games whose players take turns (PettingZoo AEC envs), {OPENING_SHARE:g} of a random game's "
                     f"mean length in moves, at least 1 ({GAME_PROBE_MOVES} random moves played when a run starts)")
    if name == "action_mask":
        rules.append("info when the env's reset info holds 'action_mask' and its observation no mask")
    if name == "actor_niceness":
        rules.append(f"{COSTLY_ACTOR_NICENESS} for env steps of {COSTLY_STEP_S * 1e3:g} ms or more")
    return f" Auto, when not given: {'; '.join(rules)}." if rules else ""


@dataclass(frozen=True)
class Choice:
    """Values for some flags, and why (one "auto:" line)."""

    flags: dict[str, Any]
    why: str

    def line(self) -> str:
        flags = " ".join(f"--{name}={value}" for name, value in self.flags.items())
        return f"auto: {flags} ({self.why})" if flags else f"auto: {self.why}"


def has_images(info: EnvInfo) -> bool:
    return any(is_image(space) for space in obs_spaces(info.obs_space).values())


def small_images(info: EnvInfo) -> bool:
    """Images all smaller than the Nature CNN takes (a side under 36 pixels: MinAtar's grids, a game's board)."""
    images = [space for space in obs_spaces(info.obs_space).values() if is_image(space)]
    return bool(images) and all(image_side(tuple(space.shape)) < NATURE_CNN_MIN_SIZE for space in images)


def continuous_actions(info: EnvInfo) -> bool:
    return all(kind == "gaussian" for kind, _ in action_spec(info.action_space))


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (Linux: its flags in /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def learns_on_cpu(device: str) -> bool:
    """Whether --device puts the learner and inference on the CPU, as appo/learning/device.py resolves it: cpu, or
    auto where torch sees no CUDA device (asked only when it matters: it may take a child process)."""
    return device == "cpu" or (device == "auto" and cuda_device_count() == 0)


def bf16_hint(cfg: Config, info: EnvInfo, given: set[str]) -> Choice | None:
    """A line naming --learner_bf16 and --inference_bf16 where they may speed the run up: images, neither flag given,
    and a CPU with native bfloat16 that learns and infers. Nothing is chosen: whether bfloat16 is faster differs
    between CPUs listing the same flags, and a choice by a timing would make the numerics depend on the machine."""
    if not (has_images(info) and not {"learner_bf16", "inference_bf16"} & given and cpu_has_bf16()
            and learns_on_cpu(cfg.device)):
        return None
    return Choice({}, "this CPU computes bfloat16 natively: --learner_bf16=True and --inference_bf16=True run the CNN "
                      "in bfloat16, faster on some such CPUs and slower on others (python scripts/bench_cnn.py "
                      "times both here); float32 unless given")


def action_dims(info: EnvInfo) -> int:
    return sum(size for _, size in action_spec(info.action_space))


def probes_noise(cfg: Config, info: EnvInfo, given: set[str]) -> bool:
    """Whether the narrow-start rule may apply, so start-up must see how often noise ends episodes early (at std 1 and
    `narrow_stddev`): continuous actions on vectors, more than one of them, and no --initial_stddev given."""
    return (continuous_actions(info) and not has_images(info) and action_dims(info) > 1
            and "initial_stddev" not in given)


def random_openings(info: EnvInfo) -> Choice:
    """Up to OPENING_SHARE of a random game's moves (`info.random_game_moves`, probed at start-up) played at random
    before each training game of a turn-based game."""
    moves = info.random_game_moves
    if moves is None:
        return Choice({"random_opening_moves": FALLBACK_OPENING_MOVES},
                      f"a turn-based game: each training game starts after 0 to {FALLBACK_OPENING_MOVES} random legal "
                      "moves, so self-play meets positions off its own lines of play (the probe of its length failed)")
    count = max(1, round(OPENING_SHARE * moves))
    return Choice({"random_opening_moves": count},
                  f"a turn-based game: each training game starts after 0 to {count} random legal moves, "
                  f"{OPENING_SHARE:g} of a random game's {moves:.1f}, so self-play meets positions off its own lines "
                  "of play")


def narrow_stddev(info: EnvInfo) -> float:
    """1/sqrt(action dimensions): the noise of all of them as wide as one action's at std 1."""
    return round(1 / math.sqrt(action_dims(info)), 3)


def narrow_start(info: EnvInfo) -> Choice | None:
    """For continuous actions on vectors: `narrow_stddev` where the probe's noise at that std ended at most
    NARROW_EARLY_ENDS as many episodes early as at std 1 (`info.noise_terminations`); else None."""
    dims = action_dims(info)
    if info.noise_terminations is None or dims < 2:
        return None
    wide, narrow = info.noise_terminations
    if wide and narrow > NARROW_EARLY_ENDS * wide:
        return None
    std = narrow_stddev(info)
    ended = ("ended no episode early" if wide == 0 else
             f"ended {wide} episodes early at std 1 and {narrow} at std {std:g}")
    return Choice({"initial_stddev": std},
                  f"{dims} continuous actions on vectors, and {NOISE_PROBE_STEPS} steps of noise {ended}: the noise "
                  f"of all {dims} starts as wide as one action's at std 1, std 1/sqrt({dims})")


def box_start(info: EnvInfo, stddev: float) -> Choice | None:
    """What the model makes of the action box at the scalar std `stddev` (appo.spaces.initial_stds), said where it
    differs from a Gaussian at 0 with that std in every dimension; None elsewhere."""
    centre, half_width = gaussian_box(info.action_space)
    stds = initial_stds(stddev, half_width)
    said = []
    if np.any(centre):
        said.append(f"the Gaussian's mean starts at the action box's centre ({_values(centre)})")
    capped = stds < stddev
    if capped.any():
        said.append(f"{capped.sum()} of {len(stds)} dimensions start at std {_values(stds[capped])}, their half width, "
                    f"not {stddev:g}: that clips as few of the samples at the bounds as std 1 does on [-1, 1]")
    if np.any(half_width == 0):
        said.append(f"{np.sum(half_width == 0)} dimensions of zero width cannot vary (the env gets their one value)")
    return Choice({}, "; ".join(said)) if said else None


def _values(values: np.ndarray) -> str:
    """Distinct values, in order, for a line: Humanoid's 17 half widths are "0.4"."""
    return ", ".join(f"{value:g}" for value in dict.fromkeys(values.tolist()))


def sampler_sizing(cfg: Config, step_seconds: float, num_agents: int = 1) -> Choice | None:
    """For an env of `num_agents` agents whose step takes `step_seconds`: envs per worker and actor niceness, or
    None for a cheap env."""
    if step_seconds < COSTLY_STEP_S:
        return None
    actors_per_inference_worker = math.ceil(cfg.num_workers / cfg.policy_workers_per_policy)
    envs = math.ceil(INFERENCE_BATCH / (actors_per_inference_worker * num_agents))
    per_split = int(np.clip(envs, ENVS_PER_SPLIT[0] if num_agents == 1 else 1, ENVS_PER_SPLIT[1]))
    actors = f"{actors_per_inference_worker} actor{'s' if actors_per_inference_worker > 1 else ''}"
    agents = f" x {num_agents} agents" if num_agents > 1 else ""
    return Choice({"num_envs_per_worker": per_split * cfg.worker_num_splits, "actor_niceness": COSTLY_ACTOR_NICENESS},
                  f"{step_seconds * 1e3:.2f} ms per env step, timed at start-up: about {INFERENCE_BATCH} observations "
                  f"per forward pass from {actors}{agents} per inference worker, and inference runs before the actors")


def fast_batched(cfg: Config) -> Choice | None:
    """For batched sampling of a natively vectorised env: bigger learner minibatches and more sub-envs per split, or
    None for any other sampling. (The caller leaves images out.)"""
    if not (steps_batched(cfg.env, cfg.batched_sampling) and natively_vectorised(cfg.env)):
        return None
    return Choice({**FAST_BATCHED, "num_envs_per_worker": FAST_BATCHED_ENVS_PER_SPLIT * cfg.worker_num_splits},
                  "batched sampling of a natively vectorised env: the sampler outruns the learner, which takes bigger "
                  "minibatches")


def choices(cfg: Config, info: EnvInfo, given: set[str] = frozenset()) -> list[Choice]:
    """Every rule that applies to this env and these given flags (names), with the values it would set (given flags
    not yet removed)."""
    found = []
    keys = obs_spaces(info.obs_space)
    if info.info_action_mask and cfg.action_mask == "auto":
        found.append(Choice({"action_mask": "info"}, "the env gives an action mask in info['action_mask'] at reset: "
                                                     "disallowed actions are never sampled"))
        keys[MASK_KEY] = gym.spaces.Box(0, 1, (mask_size(info.action_space),), np.int8)  # joins the observation
    if cfg.encoder == "auto":
        for key, space in keys.items():
            name, why = auto_encoder(space)
            found.append(Choice({}, f"encoder {name} for observation {key!r} ({why})"))
    images, continuous = has_images(info), continuous_actions(info)
    stddev = cfg.initial_stddev  # the Gaussian's scalar std, as the rules leave it
    if images:
        small = small_images(info)
        image = {name: value for name, value in IMAGE_LEARNING.items()
                 if not (continuous and name in CONTINUOUS_LEARNING) and not (small and name in SMALL_IMAGE_KEEPS)}
        found.append(Choice(image, "small image observations: the small CNN trains each sample over the passes "
                                   "vectors get" if small else
                                   "image observations: the CNN's SGD is the bottleneck"
                                   + (", each sample is trained on once" if "ppo_epochs" not in given else "")))
    if continuous:
        found.append(Choice(dict(CONTINUOUS_LEARNING), "continuous actions: the Gaussian's learned std explores, an "
                                                       "entropy bonus would keep it wide"))
    if continuous and not images:
        found.append(Choice(dict(CONTINUOUS_VECTORS), "continuous actions on vectors: the critic's own MLP keeps the "
                                                      "value loss off the policy's features"))
        narrow = narrow_start(info)
        if narrow:
            found.append(narrow)
            stddev = narrow.flags["initial_stddev"] if "initial_stddev" not in given else stddev
    if info.turn_based:
        found.append(random_openings(info))
    box = box_start(info, stddev)
    fast = None if images else fast_batched(cfg)  # (images keep IMAGE_LEARNING's learning rate)
    found += [rule for rule in (box, bf16_hint(cfg, info, given), fast) if rule]
    sizing = None if info.step_seconds is None else sampler_sizing(cfg, info.step_seconds, info.num_agents)
    if sizing and fast:  # fast batched sampling sizes the splits; a costly step still makes actors yield
        sizing = Choice({"actor_niceness": COSTLY_ACTOR_NICENESS}, f"{info.step_seconds * 1e3:.2f} ms per sub-env "
                                                                   "step, timed at start-up: inference runs first")
    return found + ([sizing] if sizing else [])


def apply(cfg: Config, given: set[str], info: EnvInfo) -> tuple[Config, list[str]]:
    """`cfg` with the values the rules choose for flags not in `given` (flag names), and the "auto:" lines to
    log. A rule whose flags were all given says nothing."""
    lines, values = [], {}
    for choice in choices(cfg, info, given):
        chosen = {name: value for name, value in choice.flags.items() if name not in given}
        if choice.flags and not chosen:
            continue
        values.update(chosen)
        lines.append(Choice(chosen, choice.why).line())
    cfg = dataclasses.replace(cfg, **values)
    if cfg.adaptive_epochs and cfg.ppo_epochs > 1:
        lines.append(Choice({}, f"up to {cfg.ppo_epochs} passes per iteration, fewer while the sampler has the next "
                                "iteration's trajectories in: the passes follow this machine's speed "
                                "(--adaptive_epochs; the status line shows them)").line())
    return cfg, lines
