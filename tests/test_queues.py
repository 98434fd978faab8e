"""The queue repairs the runner makes after a worker died inside a faster-fifo call (utils/queues.py).

Each test reproduces the fault with real processes: without the repair, the last process hangs."""

import contextlib
import multiprocessing
import os
import signal
import time

import pytest
from faster_fifo import Empty

from appo.utils.queues import forget_waiters, make_queue, mutex_owner, release_if_held_by, repair_supported

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(not repair_supported(), reason="glibc x86-64 layout only")]
fork = multiprocessing.get_context("fork")


def _hold_the_lock_often(queue) -> None:
    big = b"x" * 50_000_000  # a put copies 50 MB while it holds the mutex
    while True:
        queue.put(big)
        queue.get()


def _read_forever(queue) -> None:
    while True:
        with contextlib.suppress(Empty):
            queue.get_many(timeout=0.05)


def _put_many(queue) -> None:
    for i in range(500):
        queue.put_nowait(("message", i))
        time.sleep(0.001)


def _finishes(target, queue, seconds: float) -> bool:
    process = fork.Process(target=target, args=(queue,))
    process.start()
    process.join(seconds)
    done = not process.is_alive()
    if not done:
        process.kill()
        process.join()
    return done


def test_a_queue_whose_mutex_a_dead_process_holds_is_reset_and_usable():
    queue = make_queue(200_000_000)
    holder = fork.Process(target=_hold_the_lock_often, args=(queue,))
    holder.start()
    while mutex_owner(queue) != holder.pid:
        pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    assert not _finishes(_put_many, queue, 1.0)  # every put now blocks forever
    assert release_if_held_by(queue, holder.pid)
    assert _finishes(_put_many, queue, 10.0)
    assert len(queue.get_many(timeout=1)) > 0


def test_release_leaves_a_queue_alone_when_the_dead_process_does_not_hold_it():
    queue = make_queue()
    queue.put(("kept",))
    assert not release_if_held_by(queue, os.getpid() + 100000)
    assert queue.get(timeout=1) == ("kept",)


def test_a_reader_killed_while_waiting_does_not_hang_the_writers_of_its_replacement():
    queue = make_queue()
    reader = fork.Process(target=_read_forever, args=(queue,))
    reader.start()
    time.sleep(0.3)  # it waits inside get_many most of the time
    os.kill(reader.pid, signal.SIGKILL)
    reader.join()
    forget_waiters(queue)
    replacement = fork.Process(target=_read_forever, args=(queue,))
    replacement.start()
    try:
        time.sleep(0.3)
        assert _finishes(_put_many, queue, 10.0)
    finally:
        replacement.kill()
        replacement.join()
