"""One tensorboard event file, written with tensorboard's own pieces: its `Event`/`Summary` protocol buffers, its
text plugin's metadata and its `RecordWriter` (TFRecord framing and checksums).

Not tensorboardX: its package imports torch (a second of a core and 200 MB in the runner, which forks the workers
and must stay torch-free). Not tensorboard's `EventFileWriter` either: it writes from a thread of its own, whose
failures (a full disk) no caller can catch. Here each event is written and flushed in the caller's thread, and a
failure is its `OSError`.
"""

from __future__ import annotations

import os
import re
import socket
import time

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.metadata import create_summary_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util.tensor_util import make_tensor_proto

INVALID_TAG_CHARACTERS = re.compile(r"[^-/\w.]")  # replaced by "_", as tensorboardX does


def tensorboard_tag(tag: str) -> str:
    """The tag as tensorboard keeps it: characters it does not take become "_", no leading "/"."""
    return INVALID_TAG_CHARACTERS.sub("_", tag).lstrip("/")


class EventFile:
    """One event file in `directory` (made if missing), named as tensorboard names them:
    events.out.tfevents.<seconds>.<host>."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}")
        self._file = open(self.path, "ab")  # noqa: SIM115 (open for the run, closed by close)
        self._records = RecordWriter(self._file)
        self._write(Event(file_version="brain.Event:2"))  # every event file starts with it

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """`value` under `tag` (`tensorboard_tag`); float32 as tensorboard keeps it."""
        self._write_summary(Summary.Value(tag=tensorboard_tag(tag), simple_value=float(value)), step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        """A string for tensorboard's text plugin, under `<tag>/text_summary` (tensorboardX's tag)."""
        value = Summary.Value(tag=f"{tag}/text_summary", metadata=create_summary_metadata(None, None),
                              tensor=make_tensor_proto([text]))
        self._write_summary(value, step)

    def close(self) -> None:
        self._file.close()

    def _write_summary(self, value: Summary.Value, step: int) -> None:
        self._write(Event(step=int(step), summary=Summary(value=[value])))

    def _write(self, event: Event) -> None:
        event.wall_time = time.time()
        self._records.write(event.SerializeToString())
        self._file.flush()
