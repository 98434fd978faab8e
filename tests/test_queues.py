"""The queue repairs the runner makes after a worker died inside a faster-fifo call (utils/queues.py).

Each fault test reproduces the fault with real processes: without the repair, the last process hangs. The repairs
find faster-fifo's mutex and condition variables in a fresh queue; where pthread types are glibc x86-64's, a
faster-fifo in which they cannot be found fails here rather than skipping."""

import contextlib
import ctypes
import importlib.metadata
import multiprocessing
import os
import signal
import struct
import time

import psutil
import pytest
from faster_fifo import Empty

from appo.utils.queues import (
    DeadHolderWatch,
    SyncLayout,
    forget_waiters,
    glibc_x86_64,
    locate_sync_objects,
    make_queue,
    mutex_owner,
    release_if_held_by,
    release_if_holder_gone,
    repair_supported,
)
from tests.conftest import wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(not glibc_x86_64(), reason="glibc x86-64 pthread types only")]
fork = multiprocessing.get_context("fork")


def fresh_object(*size_t_fields: int, kind: int = 128, after: bytes = b"") -> bytes:
    """A fresh faster-fifo Queue object as glibc x86-64 lays it out: its size_t fields, the process-shared mutex
    attribute (and padding), the mutex (`kind`: 128, process-shared), the condition attribute, the two waiter counts
    (and padding), the two process-shared condition variables (__wrefs 1), then `after`."""
    condition = struct.pack("12i", *[0] * 9, 1, 0, 0)
    return (struct.pack(f"{len(size_t_fields)}Q", *size_t_fields) + struct.pack("2i", -2**31, 0)
            + struct.pack("10i", 0, 0, 0, 0, kind, 0, 0, 0, 0, 0) + struct.pack("4i", 1, 0, 0, 0) + 2 * condition
            + after)


def test_the_mutex_is_found_in_every_faster_fifo_layout():
    # 1.4.5: max_size_bytes, head, tail, size, num_elem; 1.4.6 to 1.5.2: maxsize after max_size_bytes.
    assert locate_sync_objects(fresh_object(1000, 0, 0, 0, 0)) == SyncLayout(mutex=48, waiters=92)
    assert locate_sync_objects(fresh_object(1000, 10**9, 0, 0, 0, 0)) == SyncLayout(mutex=56, waiters=100)
    assert locate_sync_objects(fresh_object(1000, 0, 0, 0, 0, after=bytes(8))) is None  # a field after the conditions
    assert locate_sync_objects(fresh_object(1000, 0, 0, 0, 0, kind=0)) is None  # not a process-shared mutex
    version = importlib.metadata.version("faster-fifo")
    assert repair_supported(), f"faster-fifo {version}: its queue's mutex and condition variables are not found"


def _hold_the_lock_often(queue) -> None:
    big = b"x" * 50_000_000  # a put copies 50 MB while it holds the mutex
    while True:
        queue.put(big)
        queue.get()


def _read_forever(queue, reading) -> None:
    """Reads until killed, waiting inside get_many nearly all the time; `reading` is set after its first wait."""
    while True:
        with contextlib.suppress(Empty):
            queue.get_many(timeout=0.05)
        reading.set()


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
    wait_for(lambda: mutex_owner(queue) == holder.pid, 30, "the holder's lock", interval=0)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    assert not _finishes(_put_many, queue, 1.0)  # every put now blocks forever
    assert release_if_held_by(queue, holder.pid)
    assert _finishes(_put_many, queue, 10.0)
    assert len(queue.get_many(timeout=1)) > 0


def test_a_mutex_held_by_a_killed_process_is_released_before_a_read_even_before_it_is_reaped():
    queue = make_queue(200_000_000)
    holder = fork.Process(target=_hold_the_lock_often, args=(queue,))
    holder.start()
    wait_for(lambda: mutex_owner(queue) == holder.pid, 30, "the holder's lock", interval=0)
    assert not release_if_holder_gone(queue)  # alive: left alone
    os.kill(holder.pid, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(holder.pid) or psutil.Process(holder.pid).status() == psutil.STATUS_ZOMBIE,
             10, "the holder's death")
    assert release_if_holder_gone(queue)  # a zombie still: the runner has not reaped it yet
    holder.join()
    assert _finishes(_put_many, queue, 10.0)
    assert not release_if_holder_gone(queue)


def test_release_leaves_a_queue_alone_when_the_dead_process_does_not_hold_it():
    queue = make_queue()
    queue.put(("kept",))
    assert not release_if_held_by(queue, os.getpid() + 100000)
    assert queue.get(timeout=1) == ("kept",)


def test_a_reader_killed_while_waiting_does_not_hang_the_writers_of_its_replacement():
    queue = make_queue()
    reading = fork.Event()
    reader = fork.Process(target=_read_forever, args=(queue, reading))
    reader.start()
    assert reading.wait(30)  # from now on it waits inside get_many nearly all the time
    os.kill(reader.pid, signal.SIGKILL)
    reader.join()
    forget_waiters(queue)
    reading.clear()
    replacement = fork.Process(target=_read_forever, args=(queue, reading))
    replacement.start()
    try:
        assert reading.wait(30)
        assert _finishes(_put_many, queue, 10.0)
    finally:
        replacement.kill()
        replacement.join()


def _lock_and_wait(queue, locked) -> None:
    """Takes the queue's mutex as a put does, then waits to be killed inside it."""
    layout = locate_sync_objects(bytes(make_queue().queue_obj_buffer))  # a fresh queue's: the same layout
    ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(queue.queue_obj_buffer) + layout.mutex))
    locked.set()
    signal.pause()  # until the test's SIGKILL


def _count_reads(queue, reads, watched: bool) -> None:
    """Reads until killed, as the runner reads its reports: waiting inside get_many nearly all the time."""
    watch = DeadHolderWatch(queue)
    if watched:
        watch.start()
    while True:
        with contextlib.suppress(Empty):
            queue.get_many(timeout=0.05)
        with reads.get_lock():
            reads.value += 1


@pytest.mark.parametrize("watched", [False, True])
def test_a_writer_killed_inside_a_put_while_the_reader_waits_blocks_the_reader_unless_watched(watched):
    queue = make_queue()
    reads, locked = fork.Value("i", 0), fork.Event()
    reader = fork.Process(target=_count_reads, args=(queue, reads, watched))
    reader.start()
    holder = fork.Process(target=_lock_and_wait, args=(queue, locked))
    try:
        wait_for(lambda: reads.value >= 3, 30, "the reader's first reads")
        holder.start()
        assert locked.wait(30)  # the reader now waits for the mutex: at its next wake-up, or at its next read
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
        before = reads.value
        if watched:
            wait_for(lambda: reads.value >= before + 20, 10, "reads after the holder's death")
            assert _finishes(_put_many, queue, 10.0)
        else:
            with pytest.raises(pytest.fail.Exception):
                wait_for(lambda: reads.value >= before + 20, 2, "reads after the holder's death")
    finally:
        reader.kill()
        reader.join()
