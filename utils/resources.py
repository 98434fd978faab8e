"""What the machine (or the container's cgroup) has left: shared memory, disk, memory, OOM kills; its CUDA devices.
Torch-free.

Running out of any of them is said in one line with the numbers and the fix, never left to a SIGBUS, a half-written
file or a traceback per log line.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import subprocess
import sys

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


def memory_cgroup_dirs(root: str = "/") -> list[str]:
    """The folders of this process's memory cgroup and of the cgroups above it that the filesystem shows, innermost
    first (a limit on any of them applies); `root` is the filesystem's root (tests point it at a fake tree).

    /proc/self/cgroup names the cgroup: the line of cgroup v1's memory controller ("4:memory:/docker/abc", under
    sys/fs/cgroup/memory) where there is one, since a hybrid system's memory limits are v1's, else cgroup v2's
    ("0::/user.slice/app.scope", under sys/fs/cgroup). A container that mounts its own cgroup at the root of the
    hierarchy while /proc/self/cgroup names the host's path (v1 without a cgroup namespace) shows only that root,
    which is then its cgroup. Without /proc/self/cgroup: the roots of v2 and v1."""
    mount = os.path.join(root, "sys", "fs", "cgroup")
    try:
        with open(os.path.join(root, "proc", "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return [folder for folder in (mount, os.path.join(mount, "memory")) if os.path.isdir(folder)]
    base, path = mount, "/"
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, cgroup = rest.partition(":")
        if "memory" in controllers.split(","):
            base, path = os.path.join(mount, "memory"), cgroup
            break
        if hierarchy == "0" and not controllers:
            path = cgroup
    parts = [part for part in path.split("/") if part]
    folders = (os.path.join(base, *parts[:depth]) for depth in range(len(parts), -1, -1))
    return [folder for folder in folders if os.path.isdir(folder)]


def _cgroup_file(folder: str, name: str) -> str:
    """The file's text; empty when the kernel has no such file there."""
    try:
        with open(os.path.join(folder, name)) as f:
            return f.read()
    except OSError:
        return ""


def memory_limit_bytes(root: str = "/") -> int:
    """The memory this run may use: the machine's, or the lowest limit of its cgroup and those above it when lower
    (memory.max of v2, memory.limit_in_bytes of v1; see memory_cgroup_dirs)."""
    limit = psutil.virtual_memory().total
    for folder in memory_cgroup_dirs(root):
        for name in ("memory.max", "memory.limit_in_bytes"):
            text = _cgroup_file(folder, name).strip()
            if text.isdigit():  # v2 says "max" when there is none
                limit = min(limit, int(text))
    return limit


def oom_kills(root: str = "/") -> int | None:
    """How many processes the kernel's OOM killer took in this process's cgroup so far (memory.events of v2,
    memory.oom_control of v1, in the innermost folder of memory_cgroup_dirs that has one; None when the kernel does
    not say)."""
    for folder in memory_cgroup_dirs(root):
        for name in ("memory.events", "memory.oom_control"):
            for line in _cgroup_file(folder, name).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return None


GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")  # NVIDIA, ROCm, WSL2: a GPU torch could use


def cuda_device_count() -> int:
    """The CUDA devices torch sees, asked in a child process: CUDA is never initialised in the runner, which forks
    the workers (a forked child cannot use a CUDA context its parent made), and torch stays out of it. A machine
    without a GPU driver's device files has none: 0 without the child's seconds of importing torch."""
    if not any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES):
        return 0
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True)
    return int(probe.stdout.strip() or 0)
