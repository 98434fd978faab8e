"""A tracker's writer in a thread of its own, so that the runner's loop never waits on a network or a tracker."""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from typing import Any

from appo.tracking.writer import Writer, one_line
from appo.utils.logs import log

QUEUE_SIZE = 1000  # records waiting for the tracker; at one a policy per --experiment_summaries_interval, hours
POLL_S = 0.5  # how often an idle thread looks whether the run has ended (a full queue may leave no room to say so)
_CLOSE = object()
_STARTED: weakref.WeakSet[Background] = weakref.WeakSet()  # this process's trackers whose thread has started


class Background(Writer):
    """Runs `writer_class(*args)` in a daemon thread behind a bounded queue: the writer is made there (its library
    imported, its run opened over the network) and every record is handed over without waiting; a record that finds
    the queue full is dropped and counted. The first failure, at the opening or later, is said in one line
    (`<tracker> stops: ...`) and the tracker's later records are dropped; training never notices.

    The thread starts with `start()`, which the runner calls once its workers are forked (a fork while another thread
    imports a module could leave the child a half-imported module it waits on forever). A worker forked later (a
    replacement) gets a copy of each started tracker without its thread: `_forget_in_child` makes that copy inert.
    `close(status)` hands over the end of the run, `wait(deadline)` gives the thread until then; one still busy is
    given up (said in its one line) and the writer's `abort` ends what it started outside this process."""

    def __init__(self, writer_class: type[Writer], *args: Any) -> None:
        self.writer_class, self.args = writer_class, args
        self.name, self.stops = writer_class.name, writer_class.stops
        self.records: queue.Queue = queue.Queue(QUEUE_SIZE)
        self.thread = threading.Thread(target=self._work, name=writer_class.name, daemon=True)
        self.status: str | None = None
        self.closing = threading.Event()
        self.failed = False
        self.dropped = 0
        self._fail_lock = threading.Lock()

    def start(self) -> None:
        self.thread.start()
        _STARTED.add(self)

    def forget(self) -> None:
        """In a forked child: the thread and the writer's run are the parent's. Records are dropped, close and wait do
        nothing (no abort of the parent's service), and no lock is taken that the parent's thread may have held at
        the fork: the queue and the events are new."""
        self.failed, self.thread = True, threading.Thread(target=self._work)  # never started: `wait` returns at once
        self.records, self.closing, self._fail_lock = queue.Queue(1), threading.Event(), threading.Lock()

    # ---------------------------------------------------------------- the runner's side: never waits
    def scalars(self, policy: int, env_steps: int, wall_time: float, values: dict[str, float]) -> None:
        self._put(("scalars", (policy, env_steps, wall_time, values)))

    def text(self, policy: int, env_steps: int, tag: str, text: str) -> None:
        self._put(("text", (policy, env_steps, tag, text)))

    def artifact(self, path: str, folder: str) -> None:
        self._put(("artifact", (path, folder)))

    def close(self, status: str | None) -> None:
        self.status = status
        self.closing.set()
        self._put(_CLOSE)  # wakes the thread now; in a full queue the thread sees `closing` once it has caught up

    def wait(self, deadline: float, seconds: float) -> None:
        """Until the thread has closed the writer, or `deadline` (time.monotonic; `seconds` after the run's end)."""
        if self.thread.ident is None:  # never started: nothing was opened
            return
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.thread.is_alive():
            self._fail(f"still busy {seconds:g} s after the run ended (a slow or unreachable server?); what it had "
                       "not sent is lost")
            self.writer_class.abort()
        if self.dropped:
            log.warning("%s: %d records were dropped while it could not keep up", self.name, self.dropped)

    def _put(self, record: object) -> None:
        if self.failed:
            return
        try:
            self.records.put_nowait(record)
        except queue.Full:
            if record is not _CLOSE:
                self.dropped += 1

    def _fail(self, why: str) -> None:
        with self._fail_lock:
            if self.failed:
                return
            self.failed = True
        log.error("%s: %s", self.stops, why)

    # ---------------------------------------------------------------- the thread
    def _work(self) -> None:
        try:
            writer: Writer | None = self.writer_class(*self.args)
        except Exception as exc:
            self._fail(one_line(exc))
            writer = None
        while True:
            try:
                record = self.records.get(timeout=POLL_S)
            except queue.Empty:
                if self.closing.is_set():
                    break
                continue
            if record is _CLOSE:
                break
            if writer is not None and not self.failed:
                method, args = record
                try:
                    getattr(writer, method)(*args)
                except Exception as exc:
                    self._fail(writer.describe(exc))
        if writer is not None:  # also after a failure: what the writer started (W&B's service) must end
            try:
                writer.close(self.status)
            except Exception as exc:
                self._fail(writer.describe(exc))


def _forget_in_child() -> None:
    for background in list(_STARTED):
        background.forget()
    _STARTED.clear()


os.register_at_fork(after_in_child=_forget_in_child)
