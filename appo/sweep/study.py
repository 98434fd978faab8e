"""The Optuna study of a sweep: where it is stored, how it samples and prunes, and how running the same command
again continues it.

The study lives in any Optuna RDB storage: by default SQLite at <train_dir>/<study>/study.db; a PostgreSQL or MySQL
URL lets sweeps on many machines share one study. It remembers the sweep that made it (env, fixed flags, space,
extra trainer flags, objective) and refuses to be continued by another. Each trial records, in one write, the host
and pid of the sweep process that runs it and when that process last renewed the record (every RENEW_S), so that a
later sweep, on any host, can tell a trial whose sweep was killed (left RUNNING for ever) from one still running: the
first is marked FAIL and its params are enqueued to run again.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState

from appo.config.cfg import ConfigError
from appo.sweep.objectives import Objective
from appo.sweep.space import Sweep

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)  # what --trials counts
CLAIM = "claim"  # the trial's user attr naming the sweep process that runs it
CLAIM_KEYS = ("host", "pid", "pid_started")
UNCLAIMED_S = 60.0  # a RUNNING trial with no claim this long after it started: its sweep died before claiming it
RENEW_S = 30.0  # how often a sweep renews the claims of its running trials
LEASE_S = 600.0  # a claim of another host not renewed this long: its sweep is gone (clocks must agree within this)
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
    """Record which sweep process runs the trial, and that it still does, in one write (a kill cannot leave half a
    claim); the scheduler calls it again every RENEW_S while the trial runs (see `abandoned`). Raises optuna's
    UpdateFinishedTrialError when the trial has been failed meanwhile (by another sweep: its claim had lapsed)."""
    me = psutil.Process()
    trial.set_user_attr(CLAIM, {"host": socket.gethostname(), "pid": me.pid, "pid_started": me.create_time(),
                                "renewed": time.time()})


def claim_of(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """A trial's claim: the one-write dict, or the host, pid and pid_started attrs that sweeps before it wrote apart
    (no renewal time); None when there is none, or only part of one."""
    found = attrs.get(CLAIM, {key: attrs[key] for key in CLAIM_KEYS if key in attrs})
    return found if isinstance(found, dict) and all(key in found for key in CLAIM_KEYS) else None


def sweep_alive(found: dict[str, Any]) -> bool:
    """Whether the sweep process of a claim made on this host still runs (the same pid, started then)."""
    try:
        return abs(psutil.Process(found["pid"]).create_time() - found["pid_started"]) < 0.01
    except psutil.NoSuchProcess:
        return False


def abandoned(trial: FrozenTrial) -> str | None:
    """Why a RUNNING trial has no sweep running it any more; None while it may have one. A claim of this host is
    judged by its process; another host's by its lease (LEASE_S since it was last renewed: the sweep there renews it
    every RENEW_S); a trial never claimed by its age (its sweep died between asking for it and claiming it)."""
    now = time.time()
    started = (trial.datetime_start or datetime.datetime.now()).timestamp()
    found = claim_of(trial.user_attrs)
    if found is None:
        return None if now - started <= UNCLAIMED_S else "its sweep process ended before it claimed it"
    if found["host"] == socket.gethostname():
        return None if sweep_alive(found) else f"its sweep process (pid {found['pid']}) ended while it ran"
    silent = now - found.get("renewed", started)
    if silent <= LEASE_S:
        return None
    return f"its sweep process on {found['host']} (pid {found['pid']}) renewed its claim {silent / 60:.0f} min ago"


def fail_abandoned(study: optuna.Study, storage: optuna.storages.RDBStorage) -> list[int]:
    """RUNNING trials that no sweep runs any more (`abandoned`), whichever host claimed them: marked FAIL with the
    reason, and their params enqueued again so that they are re-run. Returns the numbers of the trials failed."""
    study_id = storage.get_study_id_from_name(study.study_name)
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = abandoned(trial)
        if why is None:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        try:
            storage.set_trial_user_attr(trial_id, "reason", f"{why}; re-enqueued")
        except optuna.exceptions.UpdateFinishedTrialError:  # ended meanwhile, or failed by another sweep
            continue
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        if trial.params:
            study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number})
        failed.append(trial.number)
    return failed


def count(study: optuna.Study, *states: TrialState) -> int:
    return len(study.get_trials(deepcopy=False, states=states))
