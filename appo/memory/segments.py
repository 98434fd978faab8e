"""Named shared-memory segments: the weights each learner publishes, and the seqlock that guards them.

Named segments exist only for published weights, whose size only the learner (torch) knows. They are used
without multiprocessing.shared_memory, whose resource tracker would start an extra process in each worker; the
runner, which names them, unlinks them at shutdown.
"""

from __future__ import annotations

import _posixshmem  # CPython's POSIX shm_open/shm_unlink, used by multiprocessing.shared_memory itself
import contextlib
import errno
import mmap
import os
import re
import time

from appo.memory.control import SharedControl
from appo.utils.resources import SHM_DIR, SharedMemoryExhausted, free_bytes, mb, shm_shortfall


def weights_segment_name(run_token: str, policy_id: int) -> str:
    """Name of the segment a learner publishes its weights in (see appo.learning.weights); the run token starts with
    the runner's pid."""
    return f"/appo_{run_token}_p{policy_id}"


def remove_orphan_segments(directory: str = "/dev/shm") -> list[str]:
    """Unlink weight segments whose runner is gone (a runner killed with -9 cannot unlink its own); returns
    their names. A segment whose pid belongs to a live process is left alone."""
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in os.listdir(directory):
        match = re.fullmatch(r"appo_(\d+)_[0-9a-f]+_p\d+", name)
        if match and not _pid_alive(int(match.group(1))):
            unlink_segment(f"/{name}")
            removed.append(name)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def create_segment(name: str, nbytes: int) -> mmap.mmap:
    """A new segment of `nbytes`, its pages reserved now: a /dev/shm too small to hold it raises
    `SharedMemoryExhausted` here (with the numbers and the fix), instead of a SIGBUS at the first write."""
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, nbytes)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            unlink_segment(name)
            raise SharedMemoryExhausted(errno.ENOSPC, f"weights segment {name}: {shm_shortfall(nbytes)}") from None
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def check_room(names: list[str], nbytes: int) -> None:
    """Raise `SharedMemoryExhausted`, with the numbers and the fix, unless /dev/shm can hold every segment of
    `names` (`nbytes` each) that does not exist yet: a run's whole need is known before the first is made."""
    missing = [name for name in names if not os.path.exists(os.path.join(SHM_DIR, name.lstrip("/")))]
    if len(missing) * nbytes > free_bytes(SHM_DIR):
        raise SharedMemoryExhausted(errno.ENOSPC, f"{len(names)} weights segments (one per policy and self-play "
                                    f"snapshot, {mb(nbytes)} each): {shm_shortfall(len(missing) * nbytes)}")


def open_segment(name: str, nbytes: int) -> mmap.mmap:
    """Create the segment, or attach to it when a predecessor of the caller (a learner that died) made it."""
    try:
        return create_segment(name, nbytes)
    except FileExistsError:
        return attach_segment(name)


def write_weights(control: SharedControl, acting_id: int, copy_in, version: int) -> None:
    """The seqlock's write side for one acting id's weights segment: the counter is odd while `copy_in()` fills
    the segment, then the version is published (readers: `read_weights`)."""
    seq = control.learners.weights_seq
    seq[acting_id] += 1
    copy_in()
    seq[acting_id] += 1
    control.learners.policy_version[acting_id] = version


def read_weights(control: SharedControl, acting_id: int, copy_out):
    """The seqlock's read side: `copy_out()` (which copies the segment) is retried until no write overlapped it;
    returns what the last call returned."""
    seq = control.learners.weights_seq
    while True:
        before = int(seq[acting_id])
        if before % 2 == 0:
            copied = copy_out()
            if int(seq[acting_id]) == before:
                return copied
        time.sleep(0.0001)


def attach_segment(name: str) -> mmap.mmap:
    fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def unlink_segment(name: str) -> None:
    """Remove a segment if it exists."""
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink(name)
