"""The Recorder: where the trainer records its scalars, texts and files once, and from where each writer gets them."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from appo.config.checks import MLFLOW, WANDB, Tracker, installed, trackers_on
from appo.config.flags import Config
from appo.tracking.background import Background
from appo.tracking.event_file import tensorboard_tag
from appo.tracking.local import JsonlWriter, TensorboardWriter
from appo.tracking.mlflow_writer import MlflowWriter
from appo.tracking.wandb_writer import WandbWriter
from appo.tracking.writer import Writer
from appo.utils.logs import log

CLOSE_SECONDS = 30.0  # what the trackers get to send their last records at the end of a run
WRITERS: dict[Tracker, type[Writer]] = {WANDB: WandbWriter, MLFLOW: MlflowWriter}  # each tracker's (checks.TRACKERS)


class Recorder:
    """Fans each record out to its writers: tensorboard and JSONL files in the caller's thread, each tracker through
    its `Background` thread. Tags are made tensorboard's once here, so every writer keeps the same names. A writer
    that fails stops alone, said in one line (a tracker's thread says its own); the others go on."""

    def __init__(self, writers: list[Writer]) -> None:
        self.writers = list(writers)  # the ones still writing

    @property
    def tracking(self) -> bool:
        """Whether a tracker (W&B, MLflow) is on and has not failed: only they take files."""
        return any(isinstance(writer, Background) and not writer.failed for writer in self.writers)

    def start(self) -> None:
        """Start the trackers' threads (once the runner has forked its workers: see Background)."""
        for writer in self.writers:
            if isinstance(writer, Background):
                writer.start()

    def scalars(self, policy: int, env_steps: int, values: dict[str, float]) -> None:
        """One policy's values (tag -> value), all at its `env_steps`: one batch for each writer."""
        tagged = {tensorboard_tag(tag): float(value) for tag, value in values.items()}
        self._each("scalars", policy, env_steps, time.time(), tagged)

    def text(self, policy: int, env_steps: int, tag: str, text: str) -> None:
        self._each("text", policy, env_steps, tensorboard_tag(tag), text)

    def artifact(self, path: str, folder: str) -> None:
        """A file for the trackers' runs (the learning curve, a video), under `folder`."""
        self._each("artifact", path, folder)

    def close(self, status: str | None, seconds: float = CLOSE_SECONDS) -> None:
        """Close every writer; the trackers get `seconds` together to send what they hold and end their runs with
        `status` (writer.run_status; None: leave the status alone)."""
        deadline = time.monotonic() + seconds
        backgrounds = [writer for writer in self.writers if isinstance(writer, Background)]
        self._each("close", status)
        for writer in backgrounds:
            writer.wait(deadline, seconds)
        self.writers = []

    def _each(self, method: str, *args: Any) -> None:
        for writer in list(self.writers):
            try:
                getattr(writer, method)(*args)
            except Exception as exc:
                log.error("%s: %s", writer.stops, writer.describe(exc))
                self.writers.remove(writer)
                if method != "close":
                    self._close_quietly(writer)

    @staticmethod
    def _close_quietly(writer: Writer) -> None:
        """Release what a failed writer holds (its open files); it has said why it stopped."""
        with contextlib.suppress(Exception):  # the same failure again: said once already
            writer.close(None)


def open_recorder(cfg: Config, exp_dir: str, run_config: dict[str, Any]) -> Recorder:
    """The run's Recorder: tensorboard always, JSONL with --with_jsonl, W&B with --with_wandb, MLflow with
    --with_mlflow. `cfg`: the run's flags, each tracker reads its own; `run_config`: what the trackers keep as the
    run's config (every flag)."""
    writers: list[Writer] = [TensorboardWriter(exp_dir)]
    if cfg.with_jsonl:
        writers.append(JsonlWriter(exp_dir))
    writers += [Background(WRITERS[tracker], cfg, exp_dir, run_config) for tracker in trackers_on(cfg)]
    return Recorder(writers)


def send_file(cfg: Config, exp_dir: str, path: str, folder: str) -> None:
    """Send a file made after training (appo.enjoy's video) to the experiment's tracker runs, for the trackers its
    saved flags (`cfg`) turned on; each failure (a tracker no longer installed too) is one line, and the caller goes
    on either way."""
    writers: list[Writer] = []
    for tracker in trackers_on(cfg):
        if installed(tracker.module):
            writers.append(Background(WRITERS[tracker], cfg, exp_dir, None))
        else:
            log.error('%s: %s is not installed (pip install -e ".[%s]")', WRITERS[tracker].stops, tracker.module,
                      tracker.extra)
    recorder = Recorder(writers)
    recorder.start()
    recorder.artifact(path, folder)
    recorder.close(None)
