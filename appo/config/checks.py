"""What a valid set of flags is: each flag against its own type, choices and range (the flag table,
appo/config/flags.py), then the rules that tie flags together, one small named function each (`CHECKS`).

A problem raises `ConfigError` with one line that names the flag and what would be valid. The checks read flags
(from a `Config`, or an argparse.Namespace of the same names) and write nothing. Torch-free: `--encoder` is checked
against the built-in names and those registered so far, without importing the model.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from appo.config.encoders import AUTO, BUILT_IN_ENCODERS, REGISTERED
from appo.config.flags import FLAG_NAMES, NO_BUDGET, spec, value_type


class ConfigError(Exception):
    """A user-facing configuration problem; its message is printed as one line."""


class MappingError(Exception):
    """--policy_mapping cannot be loaded or returned something unusable; the message says what."""


# A user mapping: (agents of the env, learning policies, random generator) -> a learning policy per agent.
MappingFn = Callable[[int, int, np.random.Generator], Sequence[int]]


KIND_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}


def is_kind(value: Any, kind: type) -> bool:
    """Whether `value` is a `kind`: an int is a number too, a bool is no number."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def check_flag(name: str, value: Any) -> None:
    """One flag on its own: its type, then its choices or its range."""
    (kind, optional), flag = value_type(name), spec(name)
    if value is None and optional:
        return
    if not is_kind(value, kind):
        raise ConfigError(f"--{name}={value!r}: must be {KIND_NAMES[kind]}")
    if flag.choices is not None and value not in flag.choices:
        raise ConfigError(f"--{name}={value}: must be one of {', '.join(flag.choices)}")
    if flag.valid is not None and value not in flag.valid:
        raise ConfigError(f"--{name}={value}: {flag.valid.requirement(kind is int, flag.zero)}")


def check_each_flag(cfg: Any) -> None:
    for name in FLAG_NAMES:
        check_flag(name, getattr(cfg, name))


def check_ray_installed(cfg: Any) -> None:
    if cfg.backend == "ray" and not installed("ray"):
        raise ConfigError('--backend=ray needs Ray, which is not installed: pip install -e ".[ray]"')


@dataclass(frozen=True)
class Tracker:
    """A tracker the summaries can go to besides the local files, named once here for the torch-free check that its
    library is installed and for appo/tracking/recorder.py, which keys each tracker's writer by it."""

    flag: str  # the --with_<tracker> flag that turns it on
    module: str  # the library it needs
    extra: str  # the extra of pyproject.toml that installs it


WANDB = Tracker("with_wandb", "wandb", "wandb")
MLFLOW = Tracker("with_mlflow", "mlflow", "mlflow")
TRACKERS = (WANDB, MLFLOW)
WANDB_TAG_LENGTH = 64  # W&B refuses longer tags


def installed(module: str) -> bool:
    """Whether `module` can be found, without importing it (wandb and mlflow take seconds to import)."""
    try:
        return importlib.util.find_spec(module) is not None  # a look, not an import: no plain import can do that
    except (ImportError, ValueError):  # a finder that refuses it; a module set to None in sys.modules
        return False


def trackers_on(cfg: Any) -> list[Tracker]:
    """The trackers whose flag is on, in the order of TRACKERS (the flags are read here, in the config package, where
    tests/test_config.py lets a flag's name be computed)."""
    return [tracker for tracker in TRACKERS if getattr(cfg, tracker.flag)]


def check_trackers_installed(cfg: Any) -> None:
    for tracker in trackers_on(cfg):
        if not installed(tracker.module):
            raise ConfigError(f"--{tracker.flag} needs {tracker.module}, which is not installed: "
                              f'pip install -e ".[{tracker.extra}]"')


def wandb_tags(cfg: Any) -> list[str]:
    """--wandb_tags as a list: comma-separated on the command line; from Python a list, which arrives as its JSON."""
    text = cfg.wandb_tags.strip()
    try:
        tags = json.loads(text) if text.startswith("[") else [tag.strip() for tag in text.split(",") if tag.strip()]
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--wandb_tags={cfg.wandb_tags}: not a JSON list ({exc}); separate tags by commas") from exc
    if not all(isinstance(tag, str) and 0 < len(tag) <= WANDB_TAG_LENGTH for tag in tags):
        raise ConfigError(f"--wandb_tags={cfg.wandb_tags}: each tag must be a string of 1 to {WANDB_TAG_LENGTH} "
                          "characters")
    return tags


def check_serial_mode(cfg: Any) -> None:
    if cfg.serial_mode and cfg.backend != "local":
        raise ConfigError(f"--serial_mode=True runs every worker in this process: it needs --backend=local, not "
                          f"--backend={cfg.backend}")


def check_inference_workers(cfg: Any) -> None:
    if cfg.policy_workers_per_policy > cfg.num_workers:
        raise ConfigError(f"--policy_workers_per_policy={cfg.policy_workers_per_policy}: more than "
                          f"--num_workers={cfg.num_workers}; each inference worker serves its own actors")


def check_splits(cfg: Any) -> None:
    if cfg.num_envs_per_worker % cfg.worker_num_splits != 0:
        raise ConfigError(f"--num_envs_per_worker={cfg.num_envs_per_worker} is not divisible by "
                          f"--worker_num_splits={cfg.worker_num_splits}; use a multiple of it")


def check_batched_sampling(cfg: Any, num_agents: int) -> None:
    """Batched sampling steps single-agent envs only (each sub-env is one agent, so several policies and PBT map
    policies per sub-env as they do per env); needs the env's agents, so `resolve` calls it, not `validate`."""
    from appo.envs.vector import steps_batched

    if num_agents > 1 and steps_batched(cfg.env, cfg.batched_sampling):
        raise ConfigError(f"--batched_sampling=True steps single-agent envs only: --env={cfg.env} has {num_agents} "
                          "agents per env; use --batched_sampling=False")
    if cfg.action_mask.startswith("info") and steps_batched(cfg.env, cfg.batched_sampling):
        raise ConfigError(f"--action_mask={cfg.action_mask} (the default where the env's reset info holds a mask): "
                          "batched sampling steps vector envs, whose infos the masks are not read from; use "
                          "--batched_sampling=False, or --action_mask=none to sample every action")


def check_batch(cfg: Any) -> None:
    if cfg.batch_size % cfg.rollout != 0:
        raise ConfigError(f"--batch_size={cfg.batch_size} must be a multiple of --rollout={cfg.rollout}")


def check_lr_schedule(cfg: Any) -> None:
    if cfg.lr_schedule == "linear" and cfg.train_for_env_steps == NO_BUDGET:
        raise ConfigError("--lr_schedule=linear decays to 0 at --train_for_env_steps: give that budget, or use "
                          "--lr_schedule=constant")


def check_learner_ranks(cfg: Any) -> None:
    """What the flags must be for several learner ranks, on their own; whether this machine has their GPUs and ports
    is preflight.check_rank_gpus_and_ports, once the run is about to start."""
    ranks = cfg.learner_processes_per_policy
    if ranks > 1 and cfg.serial_mode:
        raise ConfigError(f"--learner_processes_per_policy={ranks}: each rank is a process of its own, which "
                          "--serial_mode=True does not start; use 1 in serial mode")
    if ranks > 1 and cfg.with_vtrace:
        raise ConfigError(f"--learner_processes_per_policy={ranks} shares minibatches out with advantages computed "
                          "before the shares (GAE); --with_vtrace=True computes them per minibatch: use 1 with it")


def check_proximal_policy(cfg: Any) -> None:
    if cfg.proximal_policy == "iteration" and cfg.with_vtrace:
        raise ConfigError("--proximal_policy=iteration weights GAE's advantages by proximal / behaviour probability; "
                          "--with_vtrace=True corrects for the behaviour policy itself: use "
                          "--proximal_policy=behaviour with it")


def check_recompute_advantages(cfg: Any) -> None:
    if cfg.recompute_advantages and cfg.with_vtrace:
        raise ConfigError("--recompute_advantages=True computes GAE again every pass; --with_vtrace=True takes its "
                          "targets from the current values at every minibatch already: use one of them")


def check_minibatch_unit(cfg: Any) -> None:
    if cfg.minibatch_unit == "step" and (cfg.use_rnn or cfg.with_vtrace):
        flag = "--use_rnn=True" if cfg.use_rnn else "--with_vtrace=True"
        raise ConfigError(f"--minibatch_unit=step draws minibatches of single steps; {flag} needs whole trajectories "
                          "in a minibatch: use --minibatch_unit=trajectory (or auto) with it")


def check_recurrence(cfg: Any) -> None:
    if cfg.recurrence != -1 and (cfg.recurrence <= 0 or cfg.rollout % cfg.recurrence != 0):
        raise ConfigError(f"--recurrence={cfg.recurrence} must be -1 or a positive divisor of --rollout={cfg.rollout}")
    if not cfg.use_rnn and cfg.recurrence not in (-1, 1):
        raise ConfigError(f"--recurrence={cfg.recurrence} needs --use_rnn=True (feed-forward models use 1)")


def check_population(cfg: Any) -> None:
    """--with_pbt needs policies to compare and a metric to compare them by."""
    if not cfg.with_pbt:
        return
    if cfg.num_policies < 2:
        raise ConfigError(f"--with_pbt=True needs a population: --num_policies={cfg.num_policies} must be 2 or more")
    if not cfg.pbt_target_objective:
        raise ConfigError("--pbt_target_objective: must name an episode metric, e.g. true_objective")


def check_perturb_factors(cfg: Any) -> None:
    if not 1 <= cfg.pbt_perturb_min <= cfg.pbt_perturb_max:
        raise ConfigError(f"--pbt_perturb_min={cfg.pbt_perturb_min}, --pbt_perturb_max={cfg.pbt_perturb_max}: "
                          "need 1 <= min <= max")


def check_self_play(cfg: Any) -> None:
    if cfg.self_play_opponents and cfg.num_policies > 1 and not cfg.shared_inference_workers:
        raise ConfigError("--self_play_opponents needs --shared_inference_workers=True with several policies (the "
                          "inference workers of a policy serve its snapshots too)")


def load_mapping(mapping: str) -> MappingFn:
    """The function `--policy_mapping=package.module:function` names (appo/population/matchmaking.py calls it)."""
    module_name, _, attribute = mapping.partition(":")
    if not module_name or not attribute:
        raise MappingError(f"--policy_mapping={mapping}: use the form package.module:function")
    try:
        module = importlib.import_module(module_name)  # importlib: the module is the user's --policy_mapping
    except ImportError as exc:
        raise MappingError(f"--policy_mapping={mapping}: cannot import {module_name!r} ({exc})") from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise MappingError(f"--policy_mapping={mapping}: {module_name} has no function {attribute!r}")
    return function


def check_policy_mapping(cfg: Any) -> None:
    """--policy_mapping names a function that can be imported."""
    if cfg.policy_mapping is None:
        return
    try:
        load_mapping(cfg.policy_mapping)
    except MappingError as exc:
        raise ConfigError(str(exc)) from exc


def check_device(cfg: Any) -> None:
    if not (cfg.device in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", cfg.device)):
        raise ConfigError(f"--device={cfg.device}: use cpu, cuda, cuda:N or auto")


def env_kwargs(cfg: Any) -> dict[str, Any]:
    """--env_kwargs as the dict passed to the env's make function."""
    try:
        kwargs = json.loads(cfg.env_kwargs)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env_kwargs={cfg.env_kwargs}: not valid JSON ({exc})") from exc
    if not isinstance(kwargs, dict):
        raise ConfigError(f"--env_kwargs={cfg.env_kwargs}: must be a JSON object such as '{{\"key\": 1}}'")
    return kwargs


def validate_encoder(name: str) -> None:
    """Without importing torch (appo/config/encoders.py): built-in names, `module:factory`, or names registered by a
    launcher."""
    if name == AUTO or name in BUILT_IN_ENCODERS or name in REGISTERED or ":" in name:
        return
    raise ConfigError(f"--encoder={name}: unknown; use {', '.join((AUTO, *BUILT_IN_ENCODERS))}, a name registered with "
                      "appo.learning.model.register_encoder, or package.module:factory")


def check_encoder(cfg: Any) -> None:
    validate_encoder(cfg.encoder)


def check_action_mask(cfg: Any) -> None:
    if cfg.action_mask in ("auto", "none", "info") or (cfg.action_mask.startswith("info:") and cfg.action_mask[5:]):
        return
    raise ConfigError(f"--action_mask={cfg.action_mask}: unknown; use auto, info, info:KEY (an info key) or none")


def check_mirror_symmetry(cfg: Any) -> None:
    """The mirrored pass runs beside the model's one, with no recurrent state of its own."""
    if cfg.mirror_symmetry and cfg.use_rnn:
        raise ConfigError("--mirror_symmetry=True needs a feed-forward model: use --use_rnn=False")


def check_experiment_name(cfg: Any) -> None:
    if not cfg.experiment or os.sep in cfg.experiment or cfg.experiment in (".", ".."):
        raise ConfigError(f"--experiment={cfg.experiment!r}: must be a plain folder name")


CHECKS = (check_each_flag, check_ray_installed, check_serial_mode, check_inference_workers, check_splits, check_batch,
          check_lr_schedule, check_learner_ranks, check_proximal_policy, check_recompute_advantages,
          check_minibatch_unit, check_recurrence, check_population, check_perturb_factors, check_self_play,
          check_policy_mapping,
          check_device, env_kwargs,  # the JSON of --env_kwargs parses to a dict
          check_encoder, check_action_mask, check_mirror_symmetry, check_experiment_name, check_trackers_installed,
          wandb_tags)  # --wandb_tags parses to a list of tags


# The checks of one flag's own value. A resumed run's command line gets these alone before its saved flags are merged
# in: the checks across flags judge the merged ones (`merge_resumed`), where the saved --use_rnn allows --recurrence.
FLAG_CHECKS = (check_each_flag, env_kwargs, check_encoder, check_action_mask, check_experiment_name, wandb_tags)


def validate(cfg: Any, checks: tuple[Callable[[Any], Any], ...] = CHECKS) -> None:
    """Every check (or those of `checks`), in order; the first problem raises `ConfigError`."""
    for check in checks:
        check(cfg)
