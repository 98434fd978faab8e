"""What the machine (or the container's cgroup) has left: shared memory, disk, memory, OOM kills. Torch-free.

Running out of any of them is said in one line with the numbers and the fix, never left to a SIGBUS, a half-written
file or a traceback per log line.
"""

from __future__ import annotations

import errno
import os
import shutil

import psutil

SHM_DIR = "/dev/shm"
FULL_BELOW = 2**20  # a write that failed with less than this free is taken for a full filesystem
SHM_HINT = "give the container more with docker run --shm-size=... (or mount a bigger tmpfs on /dev/shm)"


def mb(nbytes: float) -> str:
    """A size for a person: '1,234 MB', '6.4 MB', '256 KB'."""
    if nbytes >= 100 * 2**20:
        return f"{nbytes / 2**20:,.0f} MB"
    return f"{nbytes / 2**20:.1f} MB" if nbytes >= 2**20 else f"{nbytes / 2**10:,.0f} KB"


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem that holds `path` (its nearest existing parent)."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path or ".").free


class SharedMemoryExhausted(OSError):
    """/dev/shm cannot hold a segment: the message says how much it needs, how much is free, and the fix."""


def shm_room() -> str:
    return f"/dev/shm has {mb(free_bytes(SHM_DIR))} free: {SHM_HINT}"


def shm_shortfall(needed: int) -> str:
    return f"needs {mb(needed)} of shared memory, {shm_room()}"


def write_failure(path: str, error: BaseException) -> str:
    """One line for a file that could not be written: the path, the error (an errno's text where there is one)
    and the free space where it was going."""
    free = free_bytes(path)
    if isinstance(error, OSError) and error.errno == errno.ENOSPC and free >= FULL_BELOW:  # not this disk: /dev/shm
        return f"could not write {path}: no room in shared memory, {shm_room()}"
    if isinstance(error, OSError) and error.strerror:
        what = f"{error.strerror} (errno {error.errno})"
    elif free < FULL_BELOW:  # torch.save reports a full disk as a RuntimeError of its zip writer
        what = f"the filesystem is full ({type(error).__name__} while writing)"
    else:
        what = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
    return f"could not write {path}: {what}; {mb(free)} free there"


def memory_limit_bytes() -> int:
    """The memory this run may use: the machine's, or the cgroup's limit when it is lower (v2 or v1)."""
    limit = psutil.virtual_memory().total
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = min(limit, int(text))
    return limit


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer took in this cgroup so far (None when the kernel does not say)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None
