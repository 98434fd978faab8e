"""The sweep file: the env, the trainer flags every trial shares, what to optimise and the search space, checked
whole before any trial starts.

    study: lunarlander             # default: the file's name
    env: LunarLander-v3
    objective: final_reward        # best_reward, env_steps_to_target, seconds_to_target
    sampler: tpe                   # random, cmaes, qmc
    pruner: median                 # none
    trials: 20
    pruning: {checkpoints: 20, startup_trials: 5, warmup_checkpoints: 2}
    flags: {train_for_env_steps: 1000000, num_workers: 8}
    space:
      learning_rate: {low: 1.0e-5, high: 1.0e-2, log: true}
      gae_lambda: {low: 0.9, high: 1.0}
      rollout: {choices: [32, 64, 128]}
    enqueue:                       # trials run first, e.g. the defaults
      - {learning_rate: 0.001, gae_lambda: 0.95, rollout: 32}

A Python file (`.py`) defines the same dict as `SWEEP`. Every flag name, and every value (each fixed flag, both ends
of each range, every choice, every enqueued value), goes through the trainer's own flag table and checks
(appo/config/), so a problem is refused in one line (`ConfigError`) that names the place in the file. Values that
are valid alone but not together (a --batch_size that is no multiple of a sampled --rollout) are the trainer's to
refuse: that trial fails and the study goes on.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import runpy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from appo.config.cfg import OPTIONS, Config, ConfigError, given_flags, keyword_value, parse_args
from appo.config.checks import KIND_NAMES, check_flag
from appo.config.flags import value_type
from appo.sweep.objectives import OBJECTIVES

SAMPLERS = ("tpe", "random", "cmaes", "qmc")
PRUNERS = ("median", "none")
SETTINGS = {"objective": tuple(OBJECTIVES), "sampler": SAMPLERS, "pruner": PRUNERS}  # the file's, or the CLI's
FILE_KEYS = ("study", "env", *SETTINGS, "trials", "pruning", "flags", "space", "enqueue")
# Median pruning: report at every train_for_env_steps / checkpoints env steps; prune nothing before startup_trials
# trials have finished, nor before a trial's warmup_checkpoints-th checkpoint.
PRUNING_DEFAULTS = {"checkpoints": 20, "startup_trials": 5, "warmup_checkpoints": 2}
SET_BY_SWEEP = ("env", "train_dir", "experiment", "restart", "restart_behavior")  # per trial, by the sweep
RANGE_KEYS = ("low", "high", "log", "step")


@dataclass(frozen=True)
class Param:
    """One flag of the search space: a range (`low`, `high`, `log`, `step`) or a list of `choices`."""

    flag: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] | None = None

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial draws (or was enqueued with)."""
        if self.choices is not None:
            return trial.suggest_categorical(self.flag, list(self.choices))
        if value_type(self.flag)[0] is int:
            return trial.suggest_int(self.flag, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.flag, self.low, self.high, step=self.step, log=self.log)

    def contains(self, value: Any) -> bool:
        if self.choices is not None:
            return value in self.choices
        return self.low <= value <= self.high

    def describe(self) -> dict[str, Any]:
        return {key: value for key, value in vars(self).items() if value is not None and value is not False}


@dataclass(frozen=True)
class Sweep:
    """A checked sweep file. `settings` holds the objective, sampler and pruner the file names (the command line's
    win); flags and params are by the trainer's names, their values as the trainer takes them."""

    path: str
    study: str
    env: str
    flags: dict[str, Any]
    space: tuple[Param, ...]
    settings: dict[str, str] = field(default_factory=dict)
    trials: int | None = None
    pruning: dict[str, int] = field(default_factory=lambda: dict(PRUNING_DEFAULTS))
    enqueue: tuple[dict[str, Any], ...] = ()

    def trainer_args(self, params: dict[str, Any], extra: list[str]) -> list[str]:
        """The flags of a `python -m appo.train` command: the env, the fixed flags, the trial's params, `extra`."""
        values = {**self.flags, **params}
        return [f"--env={self.env}", *(flag_arg(name, value) for name, value in values.items() if value is not None),
                *extra]

    def fingerprint(self, extra: list[str]) -> dict[str, Any]:
        """What makes two sweeps the same study: the env, the fixed flags, the space and the extra flags."""
        return {"env": self.env, "flags": dict(sorted(self.flags.items())), "space": [p.describe() for p in self.space],
                "extra": list(extra)}


def flag_arg(name: str, value: Any) -> str:
    """`--name=value` as the trainer's parser reads it back to the same value."""
    text = repr(value) if isinstance(value, float) else str(value)  # True/False for booleans
    return f"--{name}={text}"


def load_sweep(path: str) -> Sweep:
    """The sweep file at `path`, checked; `ConfigError` (one line, naming the place in the file) if anything is off."""
    raw = read_file(path)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: a sweep file is a mapping of {', '.join(FILE_KEYS)}")
    for key in raw:
        if key not in FILE_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}{suggestion(str(key), FILE_KEYS, '')}")
    env = raw.get("env")
    if not isinstance(env, str) or not env:
        raise ConfigError(f"{path}: env: name the env to train on, e.g. env: CartPole-v1")
    study = raw.get("study", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(study, str) or not study or os.sep in study or study in (".", ".."):
        raise ConfigError(f"{path}: study: {study!r} must be a plain folder name")
    flags = {}
    for name, value in mapping(path, "flags", raw.get("flags", {})).items():
        flag = flag_name(path, f"flags.{name}", name)
        flags[flag] = checked_value(path, f"flags.{name}", flag, value)
    space = tuple(parse_param(path, name, entry) for name, entry in mapping(path, "space", raw.get("space")).items())
    if not space:
        raise ConfigError(f"{path}: space: name at least one flag to search over")
    for param in space:
        if param.flag in flags:
            raise ConfigError(f"{path}: --{param.flag} is both in flags and in space; keep one")
    settings = {}
    for key, choices in SETTINGS.items():
        if key in raw:
            if raw[key] not in choices:
                raise ConfigError(f"{path}: {key}: {raw[key]!r} must be one of {', '.join(choices)}")
            settings[key] = raw[key]
    return Sweep(path, study, env, flags, space, settings, trials=whole_number(path, "trials", raw.get("trials"), 1),
                 pruning=parse_pruning(path, raw.get("pruning", {})),
                 enqueue=parse_enqueue(path, space, raw.get("enqueue", [])))


def read_file(path: str) -> Any:
    """The file's dict: YAML (`.yaml`, `.yml`), or the `SWEEP` of a Python file (`.py`)."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such sweep file")
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            with open(path) as f:
                return yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if path.endswith(".py"):
        try:
            namespace = runpy.run_path(path)
        except Exception as exc:  # the user's code: whatever it raises is said in one line
            raise ConfigError(f"{path}: running it raised {type(exc).__name__}: {exc}") from None
        if "SWEEP" not in namespace:
            raise ConfigError(f"{path}: a Python sweep file defines SWEEP = {{...}}")
        return namespace["SWEEP"]
    raise ConfigError(f"{path}: a sweep file is YAML (.yaml, .yml) or Python (.py)")


def suggestion(name: str, names: Any, prefix: str = "--") -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def flag_name(path: str, where: str, name: Any) -> str:
    """The trainer's name of a flag the file names (ours, or Sample Factory's)."""
    if name not in OPTIONS:
        raise ConfigError(f"{path}: {where}: no trainer flag --{name}{suggestion(str(name), OPTIONS)}")
    flag = OPTIONS[name]
    if flag in SET_BY_SWEEP:
        raise ConfigError(f"{path}: {where}: --{flag} is set by the sweep for each trial")
    return flag


def checked_value(path: str, where: str, flag: str, value: Any) -> Any:
    """`value` as the trainer's flag takes it, checked against the flag table (type, choices, range)."""
    if value_type(flag)[0] is float and isinstance(value, str):
        with contextlib.suppress(ValueError):  # YAML reads 1e-5 (no dot) as a string
            value = float(value)
    value = keyword_value(flag, value)
    try:
        check_flag(flag, value)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {where}: {exc}") from None
    return value


def mapping(path: str, where: str, value: Any) -> Mapping:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: {where}: must be a mapping of flag names")
    return value


def whole_number(path: str, where: str, value: Any, least: int) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        raise ConfigError(f"{path}: {where}: {value!r} must be an integer of at least {least}")
    return value


def parse_param(path: str, name: str, entry: Any) -> Param:
    where = f"space.{name}"
    flag = flag_name(path, where, name)
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{path}: {where}: give a range {{low: .., high: ..}} or {{choices: [...]}}")
    keys = (*RANGE_KEYS, "choices")
    for key in entry:
        if key not in keys:
            raise ConfigError(f"{path}: {where}: unknown key {key!r}{suggestion(str(key), keys, '')}")
    if "choices" in entry:
        choices = entry["choices"]
        if len(entry) > 1 or not isinstance(choices, list) or not choices:
            raise ConfigError(f"{path}: {where}: choices is a non-empty list, on its own (no low, high, log, step)")
        return Param(flag, choices=tuple(checked_value(path, f"{where}.choices[{i}]", flag, value)
                                         for i, value in enumerate(choices)))
    kind = value_type(flag)[0]
    if kind not in (int, float):
        raise ConfigError(f"{path}: {where}: --{flag} takes {KIND_NAMES[kind]}, not a range: give choices")
    if "low" not in entry or "high" not in entry:
        raise ConfigError(f"{path}: {where}: a range needs low and high")
    low, high = (checked_value(path, f"{where}.{end}", flag, entry[end]) for end in ("low", "high"))
    if low is None or high is None or not low < high:
        raise ConfigError(f"{path}: {where}: low ({low}) must be a number below high ({high})")
    log = entry.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{path}: {where}.log: {log!r} must be true or false")
    if log and low <= 0:
        raise ConfigError(f"{path}: {where}: log: true needs low > 0 (got {low})")
    step = entry.get("step")
    if step is not None:
        step = checked_value(path, f"{where}.step", flag, step) if kind is int else step
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0 or log:
            raise ConfigError(f"{path}: {where}.step: {step!r} must be a positive "
                              f"{'integer' if kind is int else 'number'} (and not with log: true)")
    return Param(flag, low, high, log, step)


def parse_pruning(path: str, raw: Any) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: pruning: must be a mapping of {', '.join(PRUNING_DEFAULTS)}")
    pruning = dict(PRUNING_DEFAULTS)
    for key, value in raw.items():
        if key not in PRUNING_DEFAULTS:
            raise ConfigError(f"{path}: pruning: unknown key {key!r}{suggestion(str(key), PRUNING_DEFAULTS, '')}")
        pruning[key] = whole_number(path, f"pruning.{key}", value, 1 if key == "checkpoints" else 0)
    return pruning


def parse_enqueue(path: str, space: tuple[Param, ...], raw: Any) -> tuple[dict[str, Any], ...]:
    """Trials to run first: values of space flags (those left out are sampled), each within its range."""
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: enqueue: must be a list of {{flag: value}} mappings")
    params = {param.flag: param for param in space}
    trials = []
    for i, entry in enumerate(raw):
        trial = {}
        for name, value in mapping(path, f"enqueue[{i}]", entry).items():
            where = f"enqueue[{i}].{name}"
            flag = flag_name(path, where, name)
            if flag not in params:
                raise ConfigError(f"{path}: {where}: --{flag} is not in the space")
            trial[flag] = checked_value(path, where, flag, value)
            if not params[flag].contains(trial[flag]):
                raise ConfigError(f"{path}: {where}: {trial[flag]!r} is outside the space's {params[flag].describe()}")
        trials.append(trial)
    return tuple(trials)


def trainer_config(sweep: Sweep, extra: list[str]) -> Config:
    """The flags every trial shares (the sampled ones at their defaults), through the trainer's own parser and checks:
    the extra flags of the command line, and the fixed flags together. The extra flags may not set what the sweep
    sets, nor a flag of the space."""
    given = given_flags(token[2:].split("=", 1)[0] for token in extra if token.startswith("--"))
    for flag in sorted(given):
        if flag in SET_BY_SWEEP:
            raise ConfigError(f"--{flag} (after --) is set by the sweep for each trial")
        if flag in {param.flag for param in sweep.space}:
            raise ConfigError(f"--{flag} (after --) is in the space of {sweep.path}")
    try:
        return parse_args(sweep.trainer_args({}, extra))[0]
    except ConfigError as exc:
        raise ConfigError(f"{sweep.path} (flags, and the trainer flags after --): {exc}") from None
