"""From the command line to a run's `Config`, and the experiment's saved `cfg.json`.

The parser and `--help` are made from the flag table (appo/config/flags.py); bad values end the program with one line
naming the flag and what would be valid (`ConfigError`, appo/config/checks.py), before anything is written to the
experiment dir. A `Config` goes through these steps, each returning a new one (none is ever changed in place):

    parse_args or parse_keywords (validated)  ->  merge_resumed (a resumed run: the saved cfg.json)  ->  auto.apply
    (a new run: the env's defaults, appo/config/auto.py)  ->  resolve (the values that depend on the env)

appo/launch.py runs them (`parse_args` for the command line, `parse_keywords` for `appo.train()`); the last `Config`
goes to the runner and so to every worker. Tests and scripts build one with `make_config(env=..., **flags)` or
`parse_config(argv)`. Torch-free.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import numbers
import os
import sys
from collections.abc import Iterable
from typing import Any

from appo.config.checks import (
    CHECKS,
    ConfigError,
    check_batched_sampling,
    env_kwargs,
    validate,
    validate_encoder,
)
from appo.config.flags import (
    COMMAND_LINE_ONLY,
    ELO_OBJECTIVE,
    FLAG_NAMES,
    NO_BUDGET,
    RESTART_BEHAVIOR,
    RESTART_BEHAVIORS,
    Config,
    spec,
    value_type,
)
from appo.utils.files import atomic_write_text

__all__ = ["NO_BUDGET", "Config", "ConfigError", "OneLineParser", "build_parser", "env_kwargs",
           "experiment_dir", "load_saved_cfg", "make_config", "merge_resumed", "parse_args", "parse_config",
           "parse_keywords", "resolve", "save_cfg", "saved_config", "str2bool", "validate", "validate_encoder"]

DESCRIPTION = ("Asynchronous PPO: actor workers, batched inference workers and one learner per policy. Sample "
               "Factory's flag names are accepted too (listed next to ours; --rnn_size is --hidden_size, which also "
               "sets the MLP width). A new experiment adapts some defaults to its env (flags marked 'Auto, when not "
               "given'); each choice is logged at start-up as 'auto: ...'.")

# Flags that describe the model or the data layout; they must not change when resuming.
ARCHITECTURE_FLAGS = ["env", "env_kwargs", "use_rnn", "rnn_type", "hidden_size", "mlp_layers", "num_policies",
                      "encoder", "mirror_symmetry", "actor_critic_share_weights", "normalize_input",
                      "normalize_returns"]


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


# ---------------------------------------------------------------- the parser, from the flag table
def help_text(name: str) -> str:
    """A flag's --help: its own text, a sentence computed from other modules' constants, and the env's defaults."""
    from appo.config.auto import flag_help as auto_rules

    flag = spec(name)
    details = f" {flag.details()}" if flag.details else ""
    return (flag.help + details + auto_rules(name)).replace("%", "%%")  # argparse formats help with %


def argument_settings(name: str) -> dict[str, Any]:
    """The keyword arguments of `add_argument` for a flag of the table."""
    settings: dict[str, Any] = {"help": help_text(name), "choices": spec(name).choices}
    if name in COMMAND_LINE_ONLY:
        return {**settings, "type": str, "default": None}
    kind, _ = value_type(name)
    settings["type"] = str2bool if kind is bool else kind
    default = Config.__dataclass_fields__[name].default
    if default is dataclasses.MISSING:
        return {**settings, "required": True}
    return {**settings, "default": default}


def help_order() -> list[str]:
    """Every flag, grouped as --help lists them (groups in the order of their first flag in the table)."""
    names = [*FLAG_NAMES, *COMMAND_LINE_ONLY]
    groups = list(dict.fromkeys(spec(name).group for name in names))
    return sorted(names, key=lambda name: groups.index(spec(name).group))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m appo.train", description=DESCRIPTION,
                           allow_abbrev=False,  # a prefix such as --num_worker is an error, not a guess
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    groups: dict[str, Any] = {}
    for name in help_order():
        group = spec(name).group
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        options = [f"--{option}" for option in (name, *spec(name).aliases)]
        groups[group].add_argument(*options, **argument_settings(name))
    return parser


# Every option of the command line, by the flag it sets: each flag, its Sample Factory names, and --restart_behavior.
OPTIONS = {option: name for name in (*FLAG_NAMES, *COMMAND_LINE_ONLY) for option in (name, *spec(name).aliases)}


def given_flags(options: Iterable[str]) -> set[str]:
    """The flags the user gave, by our names (--restart_behavior is --restart): they override a resumed run's saved
    values."""
    names = {**OPTIONS, "restart_behavior": "restart"}
    return {names.get(option, option) for option in options}


def checked_config(values: dict[str, Any], checks: tuple = CHECKS) -> Config:
    """The `Config` of these flag values validated by `checks` (all of them unless given), Sample Factory's spellings
    turned into ours (--restart_behavior into --restart, --device=gpu into cuda)."""
    behavior = values.pop("restart_behavior", None)
    if behavior is not None:
        if behavior not in RESTART_BEHAVIORS:  # a keyword: the parser has checked the command line's
            raise ConfigError(f"--restart_behavior={behavior}: must be one of {', '.join(RESTART_BEHAVIOR.choices)}")
        values["restart"] = RESTART_BEHAVIORS[behavior]
    if values.get("device") == "gpu":
        values["device"] = "cuda"
    cfg = Config(**values)
    validate(cfg, checks)
    return cfg


def parse_args(argv: list[str] | None = None, checks: tuple = CHECKS) -> tuple[Config, set[str]]:
    """The command line as a `Config` validated by `checks` (not yet resolved), and the names of the flags given on
    it."""
    argv = sys.argv[1:] if argv is None else argv
    values = vars(build_parser().parse_args(argv))
    given = given_flags(token[2:].split("=", 1)[0] for token in argv if token.startswith("--"))
    return checked_config(values, checks), given


def keyword_value(name: str, value: Any) -> Any:
    """A Python value as the flag holds it: a number as the flag's kind (numpy's numbers too), a dict or list as its
    JSON text (--env_kwargs). Anything else is kept for `validate` to judge: a string for a number flag is refused
    there, as is a number for a string flag."""
    kind, _ = value_type(name)
    if isinstance(value, bool):
        return value
    if kind is float and isinstance(value, numbers.Real):
        return float(value)
    if kind is int and isinstance(value, numbers.Integral):
        return int(value)
    if kind is str and isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def parse_keywords(flags: dict[str, Any], checks: tuple = CHECKS) -> tuple[Config, set[str]]:
    """Python keywords (`train(env="CartPole-v1", use_rnn=True)`) as a validated `Config` (not yet resolved) and the
    names of the flags given: what `parse_args` makes of the same flags on the command line, with the same checks
    and error lines (but for a value of the wrong type or choice, which argparse words its own way on the command
    line). A keyword is an option of the command line (a flag, or one of its Sample Factory names); its value a
    Python value of the flag's type (`keyword_value`)."""
    unknown = [f"--{option}={value}" for option, value in flags.items() if option not in OPTIONS]
    if unknown:
        raise ConfigError(f"unrecognized arguments: {' '.join(unknown)} (see --help)")  # as argparse says it
    values = {OPTIONS[option]: value if option in COMMAND_LINE_ONLY else keyword_value(OPTIONS[option], value)
              for option, value in flags.items()}
    return checked_config(values, checks), given_flags(flags)


# ---------------------------------------------------------------- values that depend on the env
def flag_values(flags: Config | argparse.Namespace) -> dict[str, Any]:
    """Every flag's value, from a `Config` or from a Namespace of the same names (`build_parser().parse_args`)."""
    return {name: getattr(flags, name) for name in FLAG_NAMES}


def resolve(flags: Config | argparse.Namespace, num_agents: int = 1, turn_based: bool = False) -> Config:
    """Fill in the values documented as -1 / auto in --help that depend on other flags or on the env's agents (and
    whether they take turns)."""
    cfg = flags if isinstance(flags, Config) else Config(**flag_values(flags))
    splits = cfg.num_workers * cfg.worker_num_splits
    per_episode = cfg.self_play_opponents > 0 or cfg.policy_mapping is not None  # mappings drawn at episode starts
    if cfg.with_pbt and cfg.pbt_target_objective == ELO_OBJECTIVE and num_agents < 2:
        raise ConfigError(f"--pbt_target_objective={ELO_OBJECTIVE} ranks policies by the games they play against each "
                          f"other: --env={cfg.env} has one agent; use an episode metric, e.g. true_objective")
    if cfg.self_play_opponents and num_agents < 2:
        raise ConfigError(f"--self_play_opponents={cfg.self_play_opponents}: --env={cfg.env} has one agent; self-play "
                          "needs a multi-agent env (num_agents >= 2)")
    if cfg.random_opening_moves and not turn_based:
        raise ConfigError(f"--random_opening_moves={cfg.random_opening_moves}: only a turn-based game (a PettingZoo "
                          f"AEC env) has openings to play, and --env={cfg.env} is not one; use 0")
    if turn_based and cfg.rollout < num_agents:
        raise ConfigError(f"--rollout={cfg.rollout}: a move of a game of {num_agents} seats trains once its seat's "
                          "next turn is in the same trajectory, which it never is in fewer steps than seats (only "
                          f"the game's last move would train); use --rollout={num_agents} or more (default 32)")
    check_batched_sampling(cfg, num_agents)
    if per_episode and cfg.agent_policy_mapping == "split":
        raise ConfigError("--agent_policy_mapping=split gives each split one policy for the whole run; "
                          "--policy_mapping and --self_play_opponents draw per episode: use episode or auto")
    mapping = cfg.agent_policy_mapping
    if mapping == "auto":
        mapping = "split" if num_agents == 1 and splits >= cfg.num_policies and not per_episode else "episode"
    if mapping == "split" and splits < cfg.num_policies:
        raise ConfigError(f"--agent_policy_mapping=split needs a split per policy: --num_workers * --worker_num_splits"
                          f" = {splits} < --num_policies = {cfg.num_policies}")
    recurrence = cfg.recurrence
    if recurrence == -1:
        recurrence = cfg.rollout if cfg.use_rnn else 1
    unit = cfg.minibatch_unit
    if unit == "auto":
        unit = "trajectory" if cfg.use_rnn or cfg.with_vtrace else "step"
    return dataclasses.replace(cfg, agent_policy_mapping=mapping, recurrence=recurrence, minibatch_unit=unit)


# ---------------------------------------------------------------- the experiment's cfg.json
def experiment_dir(cfg: Config) -> str:
    return os.path.join(cfg.train_dir, cfg.experiment)


def load_saved_cfg(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: corrupt or unreadable cfg.json ({exc}); fix it or pass --restart=True") from exc
    if not isinstance(saved, dict) or "env" not in saved:
        raise ConfigError(f"{path}: corrupt cfg.json (not a flag dictionary); fix it or pass --restart=True")
    if "minibatch_unit" not in saved:  # saved before the flag: whole trajectories, or steps with --shuffle_steps
        saved["minibatch_unit"] = "step" if saved.get("shuffle_steps") else "trajectory"
    return saved


def merge_resumed(cfg: Config, given: set[str], saved: dict[str, Any]) -> tuple[Config, list[str]]:
    """Saved flags win unless given again on the command line; returns the merged cfg and override notes. A saved
    --restart=True told the run that wrote cfg.json to start over, not this one: it is never taken over. A saved key
    that is no flag here (a flag retired since, a newer version's, a hand edit's typo) is left out with a note, since
    the resumed run trains without it."""
    merged = flag_values(cfg)
    notes = []
    for key, saved_value in saved.items():
        if key not in merged:
            notes.append(f"{key}={saved_value!r} (saved) is no flag of this version: ignored")
            continue
        if key == "restart":
            continue
        if key in given:
            if merged[key] != saved_value:
                notes.append(f"--{key}: {saved_value!r} (saved) -> {merged[key]!r} (command line)")
        else:
            merged[key] = saved_value
    for key in ARCHITECTURE_FLAGS:
        if key in saved and saved[key] != merged[key]:
            raise ConfigError(
                f"--{key}={merged[key]} differs from the saved experiment ({saved[key]}); "
                "it cannot change on resume, pass --restart=True or use another --experiment"
            )
    merged_cfg = Config(**merged)
    validate(merged_cfg)
    return merged_cfg, notes


def save_cfg(cfg: Config, path: str) -> None:
    atomic_write_text(path, json.dumps(flag_values(cfg), indent=2, sort_keys=True))


def saved_config(path: str) -> Config:
    """The flags an experiment saved in its cfg.json (`path`), with the defaults of flags added since."""
    saved = load_saved_cfg(path)
    return Config(**{name: value for name, value in saved.items() if name in FLAG_NAMES})


# ---------------------------------------------------------------- for tests and scripts
def make_config(num_agents: int = 1, **flags: Any) -> Config:
    """The defaults with `flags` on top (`env` is required; keywords as `parse_keywords` takes them), validated and
    resolved for an env of `num_agents`."""
    return resolve(parse_keywords(flags)[0], num_agents)


def parse_config(argv: list[str], num_agents: int = 1) -> Config:
    """`argv` as the command line gives it (`["--env=CartPole-v1", "--num_workers=1"]`), validated and resolved."""
    return resolve(parse_args(argv)[0], num_agents)
