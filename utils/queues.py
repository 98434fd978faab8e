"""The queues processes send messages through (faster-fifo), and their repair after a process died holding one.

A faster-fifo queue is a ring buffer in shared memory guarded by a process-shared pthread mutex and two
condition variables, none of them robust against a process that dies while using them:
- a process killed while it holds the mutex (inside put or get, about a microsecond per call) leaves it
  locked, and every other process that touches the queue then blocks forever;
- a process killed while it waits for messages stays counted as a waiter of the condition variable; when
  a new reader waits in turn, glibc's pthread_cond_signal waits for the dead one to leave, forever, so the
  next `put` hangs (seen in the first kill -9 test of a learner).
After a worker dies, the runner calls `release_if_held_by` for every queue (if the dead pid owns the mutex,
the queue is reset to empty; its messages are lost, and every message in this project is a hint or a
report that may be lost) and `forget_waiters` for the queues the dead worker read, before its
replacement starts. The reader of a report queue (the runner, a Ray node) also keeps a `DeadHolderWatch` on it: it
waits for reports inside get with the mutex released and must take the mutex again to return, so a worker killed
inside a put in the meantime would block it in C, before it could see the death.
"""

from __future__ import annotations

import ctypes
import functools
import pickle
import platform
import struct
import sys
import threading
from dataclasses import dataclass

from faster_fifo import Queue

# glibc x86-64's pthread types in faster-fifo's C++ Queue object (queue_obj_buffer), in this order after its size_t
# fields: the mutex attribute (an int, then padding), the pthread_mutex_t (ints __lock, __count, __owner, __nusers,
# __kind, then zeros), the condition attribute (an int), the two waiter counts (ints), then the not_empty and not_full
# pthread_cond_t up to the object's end. The size_t fields differ between versions (1.4.5 has five, 1.4.6 to 1.5.2
# six: maxsize), so `locate_sync_objects` finds the mutex in a fresh queue's bytes instead of taking an offset on trust.
_MUTEX_SIZE, _COND_SIZE = 40, 48
_OWNER = 2  # the mutex's int field __owner
_FRESH_MUTEX = (0, 0, 0, 0, 128, 0, 0, 0, 0, 0)  # pthread_mutex_init's process-shared mutex (__kind's PSHARED bit)
_MUTEXATTR_PSHARED = -2**31  # the mutex attribute's int with PTHREAD_MUTEXATTR_FLAG_PSHARED (0x80000000)
_CONDATTR_PSHARED = 1  # the condition attribute's int with its process-shared bit
_SYS_FUTEX, _FUTEX_WAKE = 202, 1
_repairs = threading.Lock()  # one reset at a time in this process: a watch thread and the runner may see one death


def make_queue(max_size_bytes: int = 1_000_000) -> Queue:
    """A faster-fifo queue with plain pickle: the default ForkingPickler costs ~10 us more per message."""
    return Queue(max_size_bytes=max_size_bytes, loads=pickle.loads,
                 dumps=functools.partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL))


def glibc_x86_64() -> bool:
    """Whether pthread types here are glibc x86-64's, the only ones the repairs know."""
    return sys.platform.startswith("linux") and platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc"


@dataclass(frozen=True)
class SyncLayout:
    """Where a faster-fifo Queue object keeps its mutex and condition variables (byte offsets)."""

    mutex: int
    waiters: int  # the waiter counts; they and the condition variables run to the object's end


def locate_sync_objects(fresh_object: bytes) -> SyncLayout | None:
    """The layout of a fresh queue's object: the one 8-aligned spot holding a fresh process-shared mutex, after a
    process-shared mutex attribute and before a process-shared condition attribute, with the waiter counts and two
    condition variables filling the rest of the object. None when there is no such spot, or more than one."""
    size = len(fresh_object)
    if size % 8:
        return None
    words = struct.unpack(f"{size // 4}i", fresh_object)
    found = [offset for offset in range(8, size - _MUTEX_SIZE, 8)
             if words[(offset - 8) // 4] == _MUTEXATTR_PSHARED
             and words[offset // 4:(offset + _MUTEX_SIZE) // 4] == _FRESH_MUTEX
             and words[(offset + _MUTEX_SIZE) // 4] == _CONDATTR_PSHARED]
    if len(found) != 1:
        return None
    waiters = found[0] + _MUTEX_SIZE + 4
    conditions = (waiters + 8 + 7) // 8 * 8  # 8-aligned after the two counts
    return SyncLayout(found[0], waiters) if conditions + 2 * _COND_SIZE == size else None


@functools.cache
def _layout() -> SyncLayout | None:
    """The installed faster-fifo's layout (`locate_sync_objects` on a fresh queue), confirmed by locking that mutex
    through libc, which must write this thread's id in its owner field; None where the repairs cannot work."""
    if not glibc_x86_64():
        return None
    fresh = Queue(max_size_bytes=1000)
    layout = locate_sync_objects(bytes(fresh.queue_obj_buffer))
    if layout is None:
        return None
    mutex, libc = ctypes.c_void_p(ctypes.addressof(fresh.queue_obj_buffer) + layout.mutex), _libc()
    if libc.pthread_mutex_lock(mutex) != 0:
        return None
    owner = _mutex_words(fresh, layout)[_OWNER]
    libc.pthread_mutex_unlock(mutex)
    return layout if owner == threading.get_native_id() else None


def _mutex_words(queue: Queue, layout: SyncLayout) -> ctypes.Array:
    return (ctypes.c_int * 5).from_address(ctypes.addressof(queue.queue_obj_buffer) + layout.mutex)


def repair_supported() -> bool:
    """Whether the repairs know where the installed faster-fifo keeps its mutex and condition variables."""
    return _layout() is not None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mutex_owner(queue: Queue) -> int:
    """Thread id (the pid, for a single-threaded worker) holding the queue's mutex; 0 when free, or when the layout is
    unknown (`repair_supported`)."""
    layout = _layout()
    return 0 if layout is None else _mutex_words(queue, layout)[_OWNER]


def release_if_held_by(queue: Queue, pid: int) -> bool:
    """If dead process `pid` holds the queue's mutex, reset the queue to a fresh empty one in place and wake the
    processes blocked on the mutex; returns whether it did. The waiter counts are kept: each live process waiting
    inside get or put counts itself out when it returns."""
    layout = _layout()
    if layout is None:
        return False
    with _repairs:
        if mutex_owner(queue) != pid:
            return False
        sizes = {"max_size_bytes": queue.max_size_bytes}
        if hasattr(queue, "maxsize"):  # faster-fifo >= 1.4.6
            sizes["maxsize"] = queue.maxsize
        fresh = Queue(**sizes)
        base = ctypes.addressof(queue.queue_obj_buffer)
        ctypes.memmove(ctypes.addressof(fresh.queue_obj_buffer) + layout.waiters, base + layout.waiters, 8)  # 2 ints
        ctypes.memmove(base, ctypes.addressof(fresh.queue_obj_buffer), len(fresh.queue_obj_buffer))
        _libc().syscall(_SYS_FUTEX, ctypes.c_void_p(base + layout.mutex), _FUTEX_WAKE, 2**31 - 1, None, None, 0)
        return True


def release_if_holder_gone(queue: Queue) -> bool:
    """If the queue's mutex is held by a thread that has ended (a process killed inside put or get, reaped or still a
    zombie), reset the queue as `release_if_held_by` does; returns whether it did."""
    owner = mutex_owner(queue)
    return owner != 0 and not _alive(owner) and release_if_held_by(queue, owner)


class DeadHolderWatch:
    """A thread that calls `release_if_holder_gone` on `queue` every `interval` s, from `start` to `stop`.

    The queue's reader cannot do it itself: a reader waiting for messages inside faster-fifo's get has released the
    mutex and must take it again to return, so a writer killed inside its put in the meantime blocks the reader in C
    for good, whatever the reader checked before its read (seen as a runner that stopped printing status lines and
    ignored SIGINT after a learner rank was killed while it reported ready)."""

    def __init__(self, queue: Queue, interval: float = 0.1):
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(queue, interval), name="dead-holder-watch",
                                        daemon=True)

    def _watch(self, queue: Queue, interval: float) -> None:
        while not self._stopped.wait(interval):
            release_if_holder_gone(queue)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()


def _alive(tid: int) -> bool:
    """Whether thread (or process) `tid` still runs: its /proc entry exists and is not a zombie's."""
    try:
        with open(f"/proc/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def forget_waiters(queue: Queue) -> None:
    """Re-initialise the queue's condition variables (and waiter counts) under its mutex. Only for a queue whose
    reader died and has no replacement yet: its only waiter was the dead reader, so no live process waits."""
    layout = _layout()
    if layout is None:
        return
    base, size = ctypes.addressof(queue.queue_obj_buffer), len(queue.queue_obj_buffer)
    fresh = Queue(max_size_bytes=1000)  # only its condition variables are copied, which do not depend on the size
    mutex, libc = ctypes.c_void_p(base + layout.mutex), _libc()
    libc.pthread_mutex_lock(mutex)
    ctypes.memmove(base + layout.waiters, ctypes.addressof(fresh.queue_obj_buffer) + layout.waiters,
                   size - layout.waiters)
    libc.pthread_mutex_unlock(mutex)
