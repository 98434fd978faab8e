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
replacement starts.
"""

from __future__ import annotations

import ctypes
import functools
import pickle
import sys

from faster_fifo import Queue

# glibc x86-64 layout of faster-fifo 1.5's C++ Queue object (queue_obj_buffer): six size_t fields, the mutex
# attribute (4 bytes), then the pthread_mutex_t, whose int fields are __lock, __count, __owner, __nusers, __kind.
_MUTEX_OFFSET = 56
_LOCK, _OWNER, _KIND = 0, 2, 4
# Then the condition attribute (4 bytes), the two waiter counts (ints), and the not_empty and not_full
# pthread_cond_t (48 bytes each).
_WAITERS_OFFSET, _OBJECT_SIZE = 100, 208
_PSHARED_BIT = 128  # set in __kind of a process-shared mutex
_SYS_FUTEX, _FUTEX_WAKE = 202, 1


def make_queue(max_size_bytes: int = 1_000_000) -> Queue:
    """A faster-fifo queue with plain pickle: the default ForkingPickler costs ~10 us more per message."""
    return Queue(max_size_bytes=max_size_bytes, loads=pickle.loads,
                 dumps=functools.partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL))


def _mutex_words(queue: Queue) -> ctypes.Array:
    return (ctypes.c_int * 5).from_address(ctypes.addressof(queue.queue_obj_buffer) + _MUTEX_OFFSET)


@functools.cache
def repair_supported() -> bool:
    """Whether the layout above is the one in memory (Linux x86-64, a fresh queue shows a process-shared mutex)."""
    if not sys.platform.startswith("linux"):
        return False
    fresh = Queue(max_size_bytes=1000)
    words = _mutex_words(fresh)
    return (len(fresh.queue_obj_buffer) == _OBJECT_SIZE and words[_KIND] & _PSHARED_BIT != 0 and words[_LOCK] == 0
            and words[_OWNER] == 0)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mutex_owner(queue: Queue) -> int:
    """Thread id (the pid, for a single-threaded worker) holding the queue's mutex; 0 when free."""
    return _mutex_words(queue)[_OWNER]


def release_if_held_by(queue: Queue, pid: int) -> bool:
    """If dead process `pid` holds the queue's mutex, reset the queue to a fresh empty one in place and wake the
    processes blocked on the mutex; returns whether it did."""
    if not repair_supported() or mutex_owner(queue) != pid:
        return False
    fresh = Queue(max_size_bytes=queue.max_size_bytes, maxsize=queue.maxsize)
    ctypes.memmove(ctypes.addressof(queue.queue_obj_buffer), ctypes.addressof(fresh.queue_obj_buffer),
                   len(fresh.queue_obj_buffer))
    lock_word = ctypes.addressof(queue.queue_obj_buffer) + _MUTEX_OFFSET
    _libc().syscall(_SYS_FUTEX, ctypes.c_void_p(lock_word), _FUTEX_WAKE, 2**31 - 1, None, None, 0)
    return True


def forget_waiters(queue: Queue) -> None:
    """Re-initialise the queue's condition variables (and waiter counts) under its mutex. Only for a queue whose
    reader died and has no replacement yet: its only waiter was the dead reader, so no live process waits."""
    if not repair_supported():
        return
    base = ctypes.addressof(queue.queue_obj_buffer)
    fresh = Queue(max_size_bytes=1000)  # only its condition variables are copied, which do not depend on the size
    mutex, libc = ctypes.c_void_p(base + _MUTEX_OFFSET), _libc()
    libc.pthread_mutex_lock(mutex)
    ctypes.memmove(base + _WAITERS_OFFSET, ctypes.addressof(fresh.queue_obj_buffer) + _WAITERS_OFFSET,
                   _OBJECT_SIZE - _WAITERS_OFFSET)
    libc.pthread_mutex_unlock(mutex)
