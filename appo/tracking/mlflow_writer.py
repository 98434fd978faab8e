"""MLflow: the summaries, the config and files of a run, in an MLflow run of its own (`--with_mlflow`).

Through `mlflow.MlflowClient` only (no fluent API: no process-wide active run to clash with a caller's), imported
when a writer is made, in its `Background` thread: a run without --with_mlflow never loads mlflow.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

from appo.config.flags import Config
from appo.tracking.runs import remember_run, tracker_run
from appo.tracking.writer import Writer

SQLITE = "sqlite:///"
CREATE_TRIES = 3  # creates of an experiment that another run may make meanwhile


def tracking_uri(cfg: Config, exp_dir: str) -> str:
    """--mlflow_tracking_uri, else a SQLite store in the train dir (MLflow 3's own default backend, kept beside the
    experiments instead of in the current folder)."""
    train_dir = os.path.dirname(os.path.abspath(exp_dir))
    return cfg.mlflow_tracking_uri or f"{SQLITE}{os.path.join(train_dir, 'mlflow.db')}"


def experiment_name(cfg: Config, exp_dir: str) -> str:
    """--mlflow_experiment, else the train dir's folder name: the experiments of one train dir are runs side by side,
    each named after its --experiment."""
    return cfg.mlflow_experiment or os.path.basename(os.path.dirname(os.path.abspath(exp_dir)))


def sqlite_path(uri: str) -> str | None:
    """The database file of a SQLite store, None for other stores."""
    return os.path.abspath(uri[len(SQLITE):]) if uri.startswith(SQLITE) else None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """For a SQLite store, a lock on <database>.lock: the first client creates the tables, and two runs of a sweep
    starting together would both try."""
    path = sqlite_path(uri)
    if path is None:
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class MlflowWriter(Writer):
    """One MLflow run per experiment, in the experiment `experiment_name`, named after --experiment; its id is kept
    in tracking.json, so a resumed experiment sets the same run RUNNING again and goes on. Params: the flags,
    stringified and cut to MLflow's length limit (a resumed run adds new flags only: MLflow never changes a param; the
    cfg.json artifact is the newest config). Metrics: tensorboard's tags ("p<policy>/" before them with several
    policies) at the policy's env steps. A SQLite store keeps its artifacts beside it, in mlartifacts/.
    `run_config` None: attach to the experiment's run to send a file (appo.enjoy's video), status left alone."""

    name, stops = "mlflow tracking", "mlflow tracking stops"

    def __init__(self, cfg: Config, exp_dir: str, run_config: dict[str, Any] | None) -> None:
        from mlflow import MlflowClient

        self.uri, self.prefixed = tracking_uri(cfg, exp_dir), cfg.num_policies > 1
        with store_lock(self.uri):
            self.client = MlflowClient(tracking_uri=self.uri)
            run = self._saved_run(exp_dir)
            if run is None and run_config is None:
                raise LookupError(f"{self.uri} has no run of {exp_dir} (tracking.json names none that it holds)")
            if run is None:
                run = self._new_run(cfg, exp_dir)
        self.run_id = run.info.run_id
        if run_config is None:
            return
        if run.info.status != "RUNNING":
            self.client.update_run(self.run_id, status="RUNNING")
        self._log_config(run_config, set(run.data.params))

    def _saved_run(self, exp_dir: str) -> Any:
        """The run tracking.json names, if this store holds it (not deleted); None otherwise."""
        from mlflow.exceptions import MlflowException

        run_id = tracker_run(exp_dir, "mlflow").get("run_id")
        if run_id is None:
            return None
        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":  # another store, or deleted for good
                return None
            raise
        return run if run.info.lifecycle_stage == "active" else None

    def _experiment_id(self, name: str) -> str:
        """The experiment `name`, made (or restored) if need be. Runs that start together on a server (a sweep's
        parallel trials; a SQLite store is under `store_lock`) may both find none and both create it: the one told
        that it exists meanwhile reads it."""
        from mlflow.exceptions import MlflowException

        database = sqlite_path(self.uri)
        artifacts = None if database is None else pathlib.Path(os.path.dirname(database), "mlartifacts").as_uri()
        experiment, tries = self.client.get_experiment_by_name(name), CREATE_TRIES
        while experiment is None:
            try:
                return self.client.create_experiment(name, artifact_location=artifacts)
            except MlflowException as exc:
                tries -= 1
                if exc.error_code != "RESOURCE_ALREADY_EXISTS" or tries == 0:
                    raise
            experiment = self.client.get_experiment_by_name(name)
        if experiment.lifecycle_stage == "deleted":  # its name is taken until it is restored
            self.client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id

    def _new_run(self, cfg: Config, exp_dir: str) -> Any:
        experiment_id = self._experiment_id(experiment_name(cfg, exp_dir))
        run = self.client.create_run(experiment_id, run_name=os.path.basename(exp_dir),
                                     tags={"appo.experiment_dir": os.path.abspath(exp_dir)})
        remember_run(exp_dir, "mlflow", {"run_id": run.info.run_id, "tracking_uri": self.uri,
                                         "experiment_id": experiment_id})
        return run

    def _log_config(self, run_config: dict[str, Any], logged: set[str]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = [Param(name, str(value)[:MAX_PARAM_VAL_LENGTH]) for name, value in sorted(run_config.items())
                  if name not in logged]
        for batch in batches(params, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch)
        self.client.log_dict(self.run_id, run_config, "cfg.json")

    def key(self, policy: int, tag: str) -> str:
        return f"p{policy}/{tag}" if self.prefixed else tag

    def scalars(self, policy: int, env_steps: int, wall_time: float, values: dict[str, float]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        timestamp = int(wall_time * 1000)
        metrics = [Metric(self.key(policy, tag), value, timestamp, env_steps) for tag, value in values.items()]
        for batch in batches(metrics, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch)

    def text(self, policy: int, env_steps: int, tag: str, text: str) -> None:
        self.client.log_text(self.run_id, text, f"text/{self.key(policy, tag)}.txt")  # the latest one

    def artifact(self, path: str, folder: str) -> None:
        self.client.log_artifact(self.run_id, path, folder)

    def close(self, status: str | None) -> None:
        if status is not None:
            self.client.set_terminated(self.run_id, status)
