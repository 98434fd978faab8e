"""Experiment tracking: the trainer records once, into a `Recorder`, and each writer takes the records it keeps.

- recorder.py: `Recorder` (the fan-out, one line when a writer stops, the close with a deadline), `open_recorder`
  (the writers the flags turn on) and `send_file` (a file made after training, to the experiment's tracker runs).
- writer.py: `Writer`, what every destination is, and how a run's end is named (FINISHED, FAILED, KILLED).
- local.py (with event_file.py): the files in the experiment dir, written in the caller's thread: tensorboard's
  event files (always) and metrics.jsonl (--with_jsonl).
- background.py: `Background`, a tracker's writer in a thread of its own behind a bounded queue.
- wandb_writer.py, mlflow_writer.py: Weights & Biases (--with_wandb) and MLflow (--with_mlflow), each library
  imported only when its tracker is on.
- runs.py: tracking.json, the tracker runs an experiment continues when it is resumed.

Torch-free: the runner, which forks the workers, records.
"""

from appo.tracking.recorder import CLOSE_SECONDS, Recorder, open_recorder, send_file
from appo.tracking.writer import FAILED, FINISHED, KILLED, Writer, run_status

__all__ = ["CLOSE_SECONDS", "FAILED", "FINISHED", "KILLED", "Recorder", "Writer", "open_recorder", "run_status",
           "send_file"]
