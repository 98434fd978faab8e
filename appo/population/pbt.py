"""Population-based training: which policy copies whom and how hyper-parameters move.

The decisions are pure functions (population state and statistics in, a list of `Event`s out), so they
are tested apart from the processes; the runner applies the events (messages to learners, reward
shaping in shared memory) and this module writes the population's state and history to the experiment
dir.

Every `--pbt_period_env_steps` of its own (once past `--pbt_start_mutation`), a policy is judged against
the population by its objective (the mean over its last `--stats_avg` episodes). Truncation selection, as in
the PBT paper (Jaderberg et al., 2017), with `k = replace_count(N, --pbt_replace_fraction)`:
- in the top `k` it is left alone;
- in the bottom `k`, and far enough below a random top policy (`replacement_gap_met`: by a relative and an
  absolute gap, and by --pbt_replace_confidence standard errors of the two objectives; Elo ratings by
  --pbt_replace_elo_gap rating points, `rating_gap_met`), it takes over that policy's
  weights, optimizer state, hyper-parameters and reward shaping, then explores from them;
- in the bottom `k` with no top policy far enough ahead, it explores from its own values (a population whose
  objectives are all alike must still move, or a bad start common to all is never left);
- in the middle (neither top nor bottom) it is left alone: a policy that is doing fine keeps learning with
  the values it has, rather than each explore risking values that stop learning.

Exploring (`explore`) moves few values: each hyper-parameter and shaping coefficient is chosen with
probability `--pbt_mutation_rate`, and one is chosen at random if none was, so an explore is never a no-op.
A chosen value is, with probability `--pbt_resample_probability`, drawn anew from its prior (`Bounds.prior`,
values that learn on most tasks; a shaping coefficient only when the env declared its range), else perturbed
by a factor from [`--pbt_perturb_min`, `--pbt_perturb_max`] or its inverse. Every value is clamped to its
hard bounds (`Bounds.low`, `Bounds.high`). Resampling gets a value far off (a learning rate 100x too low) back
into a sane range in one step; small perturbations tune it from there without walking other values away.

On the wire and in `pbt/population.json` a policy's hyper-parameters are a dict of the values PBT mutates in this run
(`mutable_names`); its learner holds all of them as an appo.config.hyperparams.Hyperparams.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field

from appo.config.flags import ELO_OBJECTIVE
from appo.config.hyperparams import MUTABLE, Bounds, Hyperparams
from appo.utils.files import atomic_write_text

# Reward-shaping coefficients an env exposes are perturbed within these bounds, unless the env declares its own.
# No prior: a coefficient's sensible scale is the env's to say.
SHAPING_BOUNDS = Bounds(-1e3, 1e3, from_zero=1e-3)


def shaping_bounds(declared: dict[str, tuple[float, float]]) -> dict[str, Bounds]:
    """Bounds for the coefficients an env declares a range for (`get_reward_shaping_bounds()`): a value below
    `low` is lost in the env's own reward, one above `high` swamps it, so the range is both the hard bounds and
    the prior. A coefficient at 0 moves to `low`, or to SHAPING_BOUNDS' first step when `low` is 0 or below."""
    return {key: Bounds(low, high, from_zero=low if low > 0 else SHAPING_BOUNDS.from_zero, prior=(low, high))
            for key, (low, high) in declared.items()}


@dataclass(frozen=True)
class Settings:
    """The --pbt_* flags that the decisions use, and the bounds of the env's reward-shaping coefficients."""

    period_env_steps: int
    start_mutation: int
    replace_fraction: float
    mutation_rate: float
    replace_reward_gap: float
    replace_reward_gap_absolute: float
    perturb_min: float
    perturb_max: float
    shaping_bounds: dict[str, Bounds] = field(default_factory=dict)  # SHAPING_BOUNDS for the rest
    resample_probability: float = 0.0  # 0: perturb only
    replace_confidence: float = 0.0  # standard errors a lead must exceed; 0: the other gaps alone
    replace_elo_gap: float | None = None  # the objectives are Elo ratings: the lead a replacement needs, in points

    @staticmethod
    def from_cfg(cfg, shaping_bounds: dict[str, Bounds] | None = None) -> Settings:
        elo_gap = cfg.pbt_replace_elo_gap if cfg.pbt_target_objective == ELO_OBJECTIVE else None
        return Settings(cfg.pbt_period_env_steps, cfg.pbt_start_mutation, cfg.pbt_replace_fraction,
                        cfg.pbt_mutation_rate, cfg.pbt_replace_reward_gap, cfg.pbt_replace_reward_gap_absolute,
                        cfg.pbt_perturb_min, cfg.pbt_perturb_max, dict(shaping_bounds or {}),
                        cfg.pbt_resample_probability, cfg.pbt_replace_confidence, elo_gap)


@dataclass
class Member:
    """One policy's place in the population: what PBT sets, and when it last judged the policy."""

    hyperparams: dict[str, float]  # `mutable_names`: a part of the policy's Hyperparams
    shaping: dict[str, float] = field(default_factory=dict)
    last_decision_env_steps: int = 0
    replacements: int = 0  # times it took over another policy's weights
    mutations: int = 0


@dataclass(frozen=True)
class Event:
    """The outcome of judging one policy. `kind`: keep (top and middle), mutate (a bottom policy nobody is far
    enough ahead of explores from its own values) or replace (exploit `donor`, then explore from its values)."""

    policy: int
    kind: str
    env_steps: int
    objectives: list[float | None]  # of every policy, when judged
    donor: int | None = None
    hyperparams_before: dict[str, float] = field(default_factory=dict)
    hyperparams_after: dict[str, float] = field(default_factory=dict)
    shaping_before: dict[str, float] = field(default_factory=dict)
    shaping_after: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """One readable log line."""
        def changes(before: dict, after: dict) -> str:
            moved = [f"{k} {_fmt(before.get(k))} -> {_fmt(v)}" for k, v in after.items() if before.get(k) != v]
            return ", ".join(moved) or "no value changed"

        objective = _fmt(self.objectives[self.policy])
        text = f"PBT: policy {self.policy} ({self.env_steps} env steps, objective {objective})"
        if self.kind == "replace":
            text += (f" takes over policy {self.donor} (objective {_fmt(self.objectives[self.donor])}): weights, "
                     "optimizer and hyper-parameters;")
        else:
            text += " explores:"
        text += " " + changes(self.hyperparams_before, self.hyperparams_after)
        if self.shaping_after != self.shaping_before:
            text += "; reward shaping " + changes(self.shaping_before, self.shaping_after)
        return text


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def mutable_names(cfg) -> list[str]:
    """The hyper-parameters PBT mutates in this run: gamma only with --pbt_optimize_gamma; max_grad_norm and
    exploration_loss_coeff only when not 0, since a 0 there is a choice (no clipping; no exploration bonus, e.g.
    for continuous actions) that a factor or a prior would undo."""
    names = [name for name in MUTABLE if name != "gamma" or cfg.pbt_optimize_gamma]
    off = {"max_grad_norm": cfg.max_grad_norm == 0, "exploration_loss_coeff": cfg.exploration_loss_coeff == 0}
    return [name for name in names if not off.get(name, False)]


def replace_count(num_policies: int, fraction: float) -> int:
    """How many policies form the top and the bottom: the fraction rounded up, at least one, and at most half
    so that the two never overlap."""
    return min(num_policies // 2, max(1, math.ceil(round(fraction * num_policies, 9))))


def replacement_gap_met(best: float, worst: float, relative: float, absolute: float, noise: float = 0.0) -> bool:
    """Whether `worst` is far enough below `best` to be replaced: by more than `absolute`, `relative` of the
    larger magnitude, and `noise` (--pbt_replace_confidence standard errors of the difference, `difference_error`:
    objectives are means of a few noisy episodes, and two policies that learn equally well differ by more than 2
    standard errors in about 2% of decisions; a wrong replacement throws away a policy's progress and the
    population's diversity, a missed one costs one period).

    The relative gap is measured against the larger magnitude of the two, so it means the same for
    positive, negative and mixed returns (dividing by `best` alone, as Sample Factory does, turns the test
    around when the best return is negative and explodes when it is near 0)."""
    gap = best - worst
    return gap > absolute and gap > relative * max(abs(best), abs(worst)) and gap > noise


def rating_gap_met(best: float, worst: float, elo_gap: float) -> bool:
    """Whether Elo rating `worst` is far enough below `best` to be replaced: by more than `elo_gap` points. Only
    differences of ratings mean anything (a lead of d points is the same expected score at any level; the level is
    wherever the ratings started, appo/population/ratings.py), so no gap relative to the ratings applies."""
    return best - worst > elo_gap


def difference_error(errors: list[float | None]) -> float:
    """Standard error of a difference of independent means, from their standard errors; an unknown one (None)
    counts as 0, so unknown errors leave the other gap rules alone."""
    return math.sqrt(sum(e * e for e in errors if e is not None))


def perturb(value: float, bounds: Bounds, rng: random.Random, perturb_min: float, perturb_max: float) -> float:
    """Multiply by a factor from [perturb_min, perturb_max] or divide by it (even odds); on 1 - x for
    discount-like values. A 0 moves to `from_zero` times the factor. Clamped to the bounds."""
    factor = rng.uniform(perturb_min, perturb_max)
    if rng.random() < 0.5:
        factor = 1.0 / factor
    x = 1.0 - value if bounds.discount_like else value
    x = (bounds.from_zero if x == 0 else x) * factor
    new = 1.0 - x if bounds.discount_like else x
    return min(bounds.high, max(bounds.low, new))


def draw_from_prior(bounds: Bounds, rng: random.Random) -> float:
    """A value from `bounds.prior`: log-uniform when the prior is positive (on 1 - x for discount-like values),
    since these values matter by their ratios; uniform for a prior that reaches 0 or below. Clamped to the
    bounds."""
    low, high = bounds.prior
    if bounds.discount_like:
        low, high = 1.0 - high, 1.0 - low
    x = math.exp(rng.uniform(math.log(low), math.log(high))) if low > 0 else rng.uniform(low, high)
    new = 1.0 - x if bounds.discount_like else x
    return min(bounds.high, max(bounds.low, new))


def explore(values: dict[Hashable, float], bounds: dict[Hashable, Bounds], rng: random.Random, settings: Settings,
            default: Bounds | None = None) -> dict[Hashable, float]:
    """Each value chosen with probability --pbt_mutation_rate, one chosen at random if none was; a chosen value
    is redrawn from its prior with probability --pbt_resample_probability (when it has one), else perturbed.
    Within `bounds[name]` (else `default`)."""
    names = list(values)
    chosen = {name for name in names if rng.random() < settings.mutation_rate}
    if not chosen and names:
        chosen = {rng.choice(names)}
    explored = {}
    for name, value in values.items():
        b = bounds.get(name, default)
        if name not in chosen:
            explored[name] = value
        elif b.prior is not None and rng.random() < settings.resample_probability:
            explored[name] = draw_from_prior(b, rng)
        else:
            explored[name] = perturb(value, b, rng, settings.perturb_min, settings.perturb_max)
    return explored


def explore_member(source: Member, settings: Settings, rng: random.Random) -> tuple[dict[str, float],
                                                                                     dict[str, float]]:
    """One explore over a member's hyper-parameters and shaping together (so that at least one of all of them
    moves): the new (hyperparams, shaping)."""
    values = {("hyperparams", k): v for k, v in source.hyperparams.items()}
    values.update({("shaping", k): v for k, v in source.shaping.items()})
    bounds = {("hyperparams", k): MUTABLE[k] for k in source.hyperparams}
    bounds.update({("shaping", k): settings.shaping_bounds.get(k, SHAPING_BOUNDS) for k in source.shaping})
    explored = explore(values, bounds, rng, settings)
    parts: dict[str, dict[str, float]] = {"hyperparams": {}, "shaping": {}}
    for (part, name), value in explored.items():
        parts[part][name] = value
    return parts["hyperparams"], parts["shaping"]


def decide(env_steps: list[int], objectives: list[float | None], members: list[Member], settings: Settings,
           rng: random.Random, errors: list[float | None] | None = None) -> list[Event]:
    """Judge every policy whose period is up. `objectives[p]` is None while policy p has too few episodes;
    such a policy is neither judged nor ranked. `errors[p]`: the standard error of objectives[p] (None or no
    list: unknown), for the gap rule. Equal objectives rank in random order (a sparse objective is often 0 for
    everyone; no policy should be kept or explored for its index)."""
    errors = errors or [None] * len(objectives)
    tie_break = [rng.random() for _ in objectives]
    judged = [p for p, o in enumerate(objectives) if o is not None]
    ranked = sorted(judged, key=lambda p: (-objectives[p], tie_break[p]))
    if len(ranked) < 2:
        return []
    k = replace_count(len(ranked), settings.replace_fraction)
    bottom = ranked[-k:]
    events = []
    for policy, member in enumerate(members):
        steps = env_steps[policy]
        if (objectives[policy] is None or steps < settings.start_mutation
                or steps - member.last_decision_env_steps < settings.period_env_steps):
            continue
        if policy not in bottom:  # the top and the middle
            events.append(Event(policy, "keep", steps, list(objectives), hyperparams_before=member.hyperparams,
                                hyperparams_after=member.hyperparams, shaping_before=member.shaping,
                                shaping_after=member.shaping))
            continue
        candidate = rng.choice(ranked[:k])
        best, worst = objectives[candidate], objectives[policy]
        if settings.replace_elo_gap is not None:
            far_enough = rating_gap_met(best, worst, settings.replace_elo_gap)
        else:
            noise = settings.replace_confidence * difference_error([errors[candidate], errors[policy]])
            far_enough = replacement_gap_met(best, worst, settings.replace_reward_gap,
                                             settings.replace_reward_gap_absolute, noise)
        donor = candidate if far_enough else None
        hyperparams_after, shaping_after = explore_member(members[policy if donor is None else donor], settings, rng)
        events.append(Event(
            policy, "mutate" if donor is None else "replace", steps, list(objectives), donor=donor,
            hyperparams_before=dict(member.hyperparams), hyperparams_after=hyperparams_after,
            shaping_before=dict(member.shaping), shaping_after=shaping_after))
    return events


def apply(members: list[Member], event: Event) -> None:
    """Record a decision in the population."""
    member = members[event.policy]
    member.last_decision_env_steps = event.env_steps
    if event.kind == "keep":
        return
    member.hyperparams = dict(event.hyperparams_after)
    member.shaping = dict(event.shaping_after)
    member.mutations += 1
    member.replacements += event.kind == "replace"


# ---------------------------------------------------------------- persistence
TRANSFER_PREFIX = "transfer_"


def pbt_dir(exp_dir: str) -> str:
    return os.path.join(exp_dir, "pbt")


def transfer_path(exp_dir: str, donor: int, receiver: int) -> str:
    """Where a donor's learner writes its state for the receiver's (removed once read; a stopped run's leftovers
    are removed by `restore_population`)."""
    return os.path.join(pbt_dir(exp_dir), f"{TRANSFER_PREFIX}p{donor}_to_p{receiver}.pth")


def initial_members(cfg, num_policies: int, shaping: dict[str, float], bounds: dict[str, Bounds] | None = None,
                    rng: random.Random | None = None) -> list[Member]:
    """Every policy starts from the flags' hyper-parameters and the env's shaping, except that a coefficient the
    env declares a range for (`bounds`) is a guess worth spreading: policies 1..N-1 draw it from that range,
    log-uniformly when the range is positive (policy 0 keeps the env's value). Exploring sets them apart
    further."""
    flags = Hyperparams.from_cfg(cfg).as_dict()
    hyperparams = {name: float(flags[name]) for name in mutable_names(cfg)}
    members = [Member(dict(hyperparams), dict(shaping)) for _ in range(num_policies)]
    for member in members[1:]:
        for key, b in (bounds or {}).items():
            if key in member.shaping and b.prior is not None:
                member.shaping[key] = draw_from_prior(b, rng)
    return members


def save_population(exp_dir: str, members: list[Member]) -> None:
    """`pbt/population.json`, written atomically (complete or absent)."""
    os.makedirs(pbt_dir(exp_dir), exist_ok=True)
    path = os.path.join(pbt_dir(exp_dir), "population.json")
    atomic_write_text(path, json.dumps({"policies": [asdict(m) for m in members]}, indent=2))


def load_population(exp_dir: str, num_policies: int) -> list[Member] | None:
    """The saved population, or None if there is none; ValueError names a corrupt or mismatched file."""
    path = os.path.join(pbt_dir(exp_dir), "population.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            members = [Member(**m) for m in json.load(f)["policies"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: corrupt PBT population file ({exc}); fix it or pass --restart=True") from exc
    if len(members) != num_policies:
        raise ValueError(f"{path}: holds {len(members)} policies, the run has --num_policies={num_policies}")
    return members


def restore_population(exp_dir: str, cfg, shaping: dict[str, float], bounds: dict[str, Bounds],
                       rng: random.Random) -> list[Member]:
    """The population a run starts with: the saved one when resuming (values the run now mutates but the file
    lacks, e.g. gamma after turning on --pbt_optimize_gamma, come from the flags), else a fresh one
    (`initial_members`). Weight transfers a stopped run left half done are discarded."""
    members = load_population(exp_dir, cfg.num_policies)
    fresh = initial_members(cfg, cfg.num_policies, shaping, bounds, rng)
    if members is None:
        return fresh
    for member, default in zip(members, fresh):
        member.hyperparams = {**default.hyperparams, **member.hyperparams}
        member.shaping = {**default.shaping, **member.shaping}
    for name in os.listdir(pbt_dir(exp_dir)):
        if name.startswith(TRANSFER_PREFIX):
            os.remove(os.path.join(pbt_dir(exp_dir), name))
    return members


def append_history(exp_dir: str, event: Event) -> None:
    """One line of `pbt/history.jsonl` per decision (a "keep" too, so plots have every policy every period)."""
    os.makedirs(pbt_dir(exp_dir), exist_ok=True)
    line = {"time": time.time(), **asdict(event)}
    with open(os.path.join(pbt_dir(exp_dir), "history.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
