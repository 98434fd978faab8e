"""The Optuna study of a sweep: where it is stored, how it samples and prunes, and how running the same command
again continues it.

The study lives in any Optuna RDB storage: by default SQLite at <train_dir>/<study>/study.db; a PostgreSQL or MySQL
URL lets sweeps on many machines share one study. It remembers the sweep that made it (env, fixed flags, space,
extra trainer flags, objective) and refuses to be continued by another. Each trial records the host and pid of the
sweep process that runs it, so that a later run on the same host can tell a trial whose sweep was killed (left
RUNNING for ever) from one still running: the first is marked FAIL and its params are enqueued to run again.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import socket
from collections.abc import Callable
from typing import Any

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState

from appo.config.cfg import ConfigError
from appo.sweep.objectives import Objective
from appo.sweep.space import Sweep

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)  # what --trials counts
# A trial asked for by a sweep that died before it recorded its host and pid is abandoned after this long.
UNCLAIMED_S = 60.0
SAMPLER_PACKAGES = {"cmaes": "cmaes", "qmc": "scipy"}  # Optuna's samplers that need a package of their own


def default_storage(study_dir: str) -> str:
    return f"sqlite:///{os.path.abspath(os.path.join(study_dir, 'study.db'))}"


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The storage at `url`; a locked or unreachable database is refused in one line."""
    import sqlalchemy.exc

    try:
        return optuna.storages.RDBStorage(url)
    except sqlalchemy.exc.OperationalError as exc:
        cause = " ".join(str(exc.orig).split())
        hint = "; another process holds it (a sweep of this study still running?)" if "locked" in cause else ""
        raise ConfigError(f"--storage={url}: {cause}{hint}") from None
    except (sqlalchemy.exc.ArgumentError, ImportError, ValueError) as exc:
        raise ConfigError(f"--storage={url}: not a database URL Optuna can use ({exc})") from None


def check_sampler(name: str) -> None:
    """Refuse a sampler whose package is missing before anything is created."""
    package = SAMPLER_PACKAGES.get(name)
    if package is not None and importlib.util.find_spec(package) is None:
        raise ConfigError(f"--sampler={name} needs the {package} package: pip install {package}")


def make_sampler(name: str, seed: int | None, parallel: int, seen: int) -> optuna.samplers.BaseSampler:
    """`seen`: the trials the study has already. A continued study's sampler is seeded with `seed + seen`, so that it
    does not draw again the values the first run drew (its random start-up trials would repeat)."""
    seed = None if seed is None else seed + seen
    if name == "tpe":  # constant liar: trials running at once are not all drawn next to the same best one
        return optuna.samplers.TPESampler(seed=seed, constant_liar=parallel > 1)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    return optuna.samplers.QMCSampler(seed=seed)


def make_pruner(name: str, sweep: Sweep, interval: int) -> optuna.pruners.BasePruner:
    """The median pruner compares trials at checkpoints `interval` env steps apart (appo/sweep/trial.py)."""
    if name == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=sweep.pruning["startup_trials"],
                                       n_warmup_steps=sweep.pruning["warmup_checkpoints"] * interval)


def open_study(storage: optuna.storages.RDBStorage, name: str, sweep: Sweep, extra: list[str], objective: Objective,
               sampler: Callable[[int], optuna.samplers.BaseSampler], pruner: optuna.pruners.BasePruner,
               create: bool = True) -> tuple[optuna.Study, bool]:
    """The study `name`, continued or (with `create`) created with the file's enqueued trials; and whether it is
    new. `sampler(n)` makes the sampler of a study that has n trials."""
    fingerprint = sweep.fingerprint(extra)
    if name in optuna.get_all_study_names(storage):
        seen = len(storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False))
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler(seen), pruner=pruner)
        check_same_sweep(study, storage.url, fingerprint, objective)
        return study, False
    if not create:
        raise ConfigError(f"no study {name!r} in {storage.url}: run the sweep first")
    study = optuna.create_study(storage=storage, study_name=name, direction=objective.direction, sampler=sampler(0),
                                pruner=pruner)
    study.set_user_attr("sweep", fingerprint)
    study.set_user_attr("objective", objective.name)
    study.set_user_attr("sweep_file", os.path.abspath(sweep.path))
    for params in sweep.enqueue:
        study.enqueue_trial(params)
    return study, True


def check_same_sweep(study: optuna.Study, url: str, fingerprint: dict[str, Any], objective: Objective) -> None:
    """A study is continued only by the sweep that made it: same env, flags, space, extra flags and objective."""
    where = f"study {study.study_name!r} in {url}"
    saved = study.user_attrs.get("sweep")
    if saved is None:
        raise ConfigError(f"{where} was not made by appo.sweep; use another --study")
    made_with = study.user_attrs.get("objective")
    if made_with != objective.name or study.direction.name.lower() != objective.direction:
        raise ConfigError(f"{where} optimises --objective={made_with} ({study.direction.name.lower()}), not "
                          f"{objective.name}; use that objective or another --study")
    differ = [key for key in fingerprint if json.dumps(saved.get(key), sort_keys=True)
              != json.dumps(fingerprint[key], sort_keys=True)]
    if differ:
        raise ConfigError(f"{where} was made by a sweep with other {', '.join(differ)} (file "
                          f"{study.user_attrs.get('sweep_file')}); use another --study, or that file and flags")


def claim(trial: optuna.Trial) -> None:
    """Record which sweep process runs the trial (see `fail_abandoned`)."""
    me = psutil.Process()
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", me.pid)
    trial.set_user_attr("pid_started", me.create_time())


def sweep_alive(attrs: dict[str, Any]) -> bool:
    """Whether the sweep process that claimed a trial on this host still runs (the same pid, started then)."""
    try:
        return abs(psutil.Process(attrs["pid"]).create_time() - attrs["pid_started"]) < 0.01
    except psutil.NoSuchProcess:
        return False


def abandoned(trial: FrozenTrial) -> bool:
    attrs = trial.user_attrs
    if "host" not in attrs:
        age = datetime.datetime.now() - (trial.datetime_start or datetime.datetime.now())
        return age.total_seconds() > UNCLAIMED_S
    return attrs["host"] == socket.gethostname() and not sweep_alive(attrs)


def fail_abandoned(study: optuna.Study, storage: optuna.storages.RDBStorage) -> list[int]:
    """Trials left RUNNING by a sweep of this host that is gone (killed): marked FAIL with the reason, and their
    params enqueued again so that they are re-run. Trials of sweeps on other hosts are theirs to judge. Returns the
    numbers of the trials failed."""
    study_id = storage.get_study_id_from_name(study.study_name)
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not abandoned(trial):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_user_attr(trial_id, "reason", f"its sweep process (pid {trial.user_attrs.get('pid')}) "
                                                        "ended while it ran; re-enqueued")
        study.tell(trial.number, state=TrialState.FAIL)
        if trial.params:
            study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number})
        failed.append(trial.number)
    return failed


def count(study: optuna.Study, *states: TrialState) -> int:
    return len(study.get_trials(deepcopy=False, states=states))
