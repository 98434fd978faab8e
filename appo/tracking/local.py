"""The writers of files in the experiment dir, called in the runner's thread: tensorboard (always on) and JSONL."""

from __future__ import annotations

import json
import math
import os
from typing import IO

from appo.tracking.event_file import EventFile
from appo.tracking.writer import Writer
from appo.utils.resources import write_failure


class TensorboardWriter(Writer):
    """One event file per policy under <exp_dir>/summaries/<policy>/, made on first use; each value is an event of
    its own at the policy's env steps, as `appo.plot` and tensorboard read them."""

    name, stops = "tensorboard summaries", "tensorboard summaries stop"

    def __init__(self, exp_dir: str) -> None:
        self.directory = os.path.join(exp_dir, "summaries")
        self.files: dict[int, EventFile] = {}

    def _file(self, policy: int) -> EventFile:
        if policy not in self.files:
            self.files[policy] = EventFile(os.path.join(self.directory, str(policy)))
        return self.files[policy]

    def scalars(self, policy: int, env_steps: int, wall_time: float, values: dict[str, float]) -> None:
        event_file = self._file(policy)
        for tag, value in values.items():
            event_file.add_scalar(tag, value, env_steps)

    def text(self, policy: int, env_steps: int, tag: str, text: str) -> None:
        self._file(policy).add_text(tag, text, env_steps)

    def close(self, status: str | None) -> None:
        for event_file in self.files.values():
            event_file.close()

    def describe(self, error: BaseException) -> str:
        return write_failure(self.directory, error)


class JsonlWriter(Writer):
    """<exp_dir>/metrics.jsonl, appended to (a resumed run goes on in the same file): one JSON object a line per
    policy and write, {"policy", "env_steps", "wall_time", then tag: value}, the tags tensorboard's. JSON has no NaN or
    infinity: such a value is null."""

    name, stops = "jsonl metrics", "jsonl metrics stop"

    def __init__(self, exp_dir: str) -> None:
        self.path = os.path.join(exp_dir, "metrics.jsonl")
        self.file: IO[str] | None = None

    def scalars(self, policy: int, env_steps: int, wall_time: float, values: dict[str, float]) -> None:
        if self.file is None:
            self.file = open(self.path, "a")  # noqa: SIM115 (open for the run, closed by close)
        record = {"policy": policy, "env_steps": env_steps, "wall_time": round(wall_time, 3),
                  **{tag: value if math.isfinite(value) else None for tag, value in values.items()}}
        self.file.write(json.dumps(record, allow_nan=False) + "\n")
        self.file.flush()

    def close(self, status: str | None) -> None:
        if self.file is not None:
            self.file.close()

    def describe(self, error: BaseException) -> str:
        return write_failure(self.path, error)
