"""Running out of disk or shared memory, and deaths that repeat: one line each, what was saved is kept, no hang.

The end-to-end tests give the trainer a tiny tmpfs as --train_dir or as /dev/shm, in a private mount namespace
(`unshare -m`), so nothing outside the test sees it; where the machine does not allow that, they are skipped.
"""

import faulthandler
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import psutil
import pytest
from faster_fifo import Empty

from appo.memory.segments import check_room
from appo.messages import WorkerFailed, WorkerReady
from appo.run.roles import Role, nothing_to_lower
from appo.run.supervisor import EARLY_DEATH_S, Supervisor, signal_cause
from appo.utils.queues import make_queue
from appo.utils.resources import (
    SHM_DIR,
    SharedMemoryExhausted,
    free_bytes,
    memory_limit_bytes,
    oom_kills,
    write_failure,
)
from tests.conftest import REPO


def private_tmpfs_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=10)
    return probe.returncode == 0


needs_private_tmpfs = pytest.mark.skipif(not private_tmpfs_works(),
                                         reason="needs root and unshare -m to mount a private tmpfs")


def in_private_mount(script: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


# What another process does to --train_dir once a 12 s run has saved its first checkpoint, how it is undone, what
# the learner then says. (A
# filesystem turning read-only cannot be played here: the kernel refuses to remount one with files open to write.)
DISK_TROUBLE = {
    "full": ("dd if=/dev/zero of={dir}/filler bs=4k 2>/dev/null", "rm {dir}/filler", r"full|No space left"),
}


@pytest.mark.slow
@needs_private_tmpfs
@pytest.mark.timeout(120)
@pytest.mark.parametrize("trouble", DISK_TROUBLE)
def test_a_disk_that_fails_mid_run_costs_checkpoints_not_the_run(tmp_path, trouble):
    cause, undo, said = (text.format(dir=tmp_path) for text in DISK_TROUBLE[trouble])
    train = f"{sys.executable} -m appo.train --env=CartPole-v1 --experiment=disk --train_dir={tmp_path}"
    first_checkpoint = f"until ls {tmp_path}/disk/checkpoint_p0/checkpoint_*.pth >/dev/null 2>&1; do sleep 0.1; done"
    result = in_private_mount(
        f"mount -t tmpfs -o size=2m tmpfs {tmp_path} && ({train} --train_for_seconds=12 --save_every_sec=1 & "
        f"{first_checkpoint}; {cause}; wait $!; echo exit=$?; {undo}; {train} --train_for_seconds=16)", timeout=110)
    first, _, second = result.stdout.partition("exit=")
    assert second.startswith("0"), result.stdout[-3000:] + result.stderr[-3000:]
    assert "Logging error" not in result.stdout + result.stderr and "Traceback" not in result.stdout + result.stderr
    failures = re.findall(r"checkpoint not saved, training goes on .*: could not write \S+: (.*)", first)
    assert len(failures) == 1 and re.search(said, failures[0]), first[-3000:]
    assert "Stopped: reached --train_for_seconds=12" in first
    # The newest intact checkpoint the first run kept is the one the second run resumes from.
    kept = re.search(r"p0 checkpoint: (\S+)", first).group(1)
    assert f"resumed from {kept}" in second, second[-3000:]


def refusal_at_start(mount_point: str, size: str, train_dir: pathlib.Path, *flags: str) -> str:
    """The one line a run refused before it starts prints (exit code 2, its experiment dir not made), with a tmpfs
    of `size` on `mount_point`."""
    result = in_private_mount(f"mount -t tmpfs -o size={size} tmpfs {mount_point} && {sys.executable} -m appo.train "
                              f"--env=CartPole-v1 --experiment=refused --train_dir={train_dir} {' '.join(flags)}", 50)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (train_dir / "refused").exists()
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
@needs_private_tmpfs
@pytest.mark.timeout(60)
def test_a_run_the_shared_memory_cannot_hold_is_refused_before_it_starts(tmp_path):
    line = refusal_at_start("/dev/shm", "256k", tmp_path, "--hidden_size=512")  # 1.1 MB of weights
    assert re.fullmatch(r"error: /dev/shm is too small for this run: 1 weights segment \(one per policy and self-play "
                        r"snapshot, [\d.,]+ [KM]B each\) need [\d.,]+ [KM]B, /dev/shm has [\d.,]+ [KM]B free: "
                        r".*--shm-size.*", line), line


@pytest.mark.slow
@needs_private_tmpfs
@pytest.mark.timeout(60)
def test_a_train_dir_too_small_for_the_checkpoints_is_refused_before_it_starts(tmp_path):
    line = refusal_at_start(str(tmp_path), "100k", tmp_path, "--keep_checkpoints=5")
    assert re.fullmatch(rf"error: --train_dir={tmp_path}: --keep_checkpoints=5 for 1 policy needs about [\d.,]+ KB, "
                        r"[\d.,]+ KB free there; use another --train_dir or a lower --keep_checkpoints", line), line


def test_a_segment_that_does_not_fit_is_refused_with_the_numbers():
    with pytest.raises(SharedMemoryExhausted, match=r"needs [\d.,]+ MB of shared memory, /dev/shm has .*--shm-size"):
        check_room(["/appo_test_never_made"], free_bytes(SHM_DIR) + 2**30)


def sigbus_after_ready(report_queue, name: str) -> None:
    report_queue.put(WorkerReady(name))
    faulthandler.disable()  # pytest's would print the forked child's stack on the way out
    os.kill(os.getpid(), signal.SIGBUS)


class DiesBySigbus:
    """A worker that reports ready, then dies as a write to a full /dev/shm would."""

    main = staticmethod(sigbus_after_ready)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_worker_that_dies_the_same_way_twice_at_start_stops_the_run():
    report_queue = make_queue()
    supervisor = Supervisor(report_queue, max_restarts=10)
    role = Role("actor", lambda: DiesBySigbus, nothing_to_lower)
    supervisor.add("actor_0", role, lambda: (report_queue, "actor_0"), inbox=make_queue())

    def drain() -> None:
        try:
            for message in report_queue.get_many(timeout=0.5):
                if isinstance(message, WorkerReady):
                    supervisor.on_ready(message.name)
                elif isinstance(message, WorkerFailed):
                    supervisor.on_failed(message)
        except Empty:
            pass

    reasons = []
    for _ in range(2):
        supervisor.workers["actor_0"].process.join(10)
        reasons.append(supervisor.replace_dead([], drain))
    supervisor.join_all(0, lambda: None)
    assert reasons[0] is None  # the first death is replaced: it may have been bad luck
    assert reasons[1].startswith(f"actor_0 died the same way twice within {EARLY_DEATH_S:g} s of its start")
    assert "killed by SIGBUS: shared memory exhausted? /dev/shm has" in reasons[1] and "--shm-size" in reasons[1]


def test_causes_name_what_the_kernel_says():
    assert signal_cause(signal.SIGKILL, None) == "killed by SIGKILL"  # no cgroup counter: only the signal
    assert signal_cause(signal.SIGSEGV, 0) == "killed by SIGSEGV"
    assert "shared memory exhausted" in signal_cause(signal.SIGBUS, 0)
    full = write_failure("/nonexistent/dir/x.pth", OSError(28, "No space left on device"))
    assert full.startswith("could not write /nonexistent/dir/x.pth: ") and " free" in full


# ---------------------------------------------------------------- the cgroup's memory limit and OOM kills
MB = 2**20
UNLIMITED_V1 = "9223372036854771712"  # what cgroup v1 says when there is no limit
CGROUPS = {  # /proc/self/cgroup, files under /sys/fs/cgroup, then the limit (MB) and the OOM kills to read there
    "v2 nested: the lowest limit of the cgroup and those above it": (
        "0::/user.slice/app.scope\n",
        {"user.slice/memory.max": f"{300 * MB}\n", "user.slice/app.scope/memory.max": f"{200 * MB}\n",
         "user.slice/app.scope/memory.events": "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n"},
        200, 2),
    "v2: no limit on the cgroup, one above it": (
        "0::/user.slice/app.scope\n",
        {"user.slice/memory.max": f"{300 * MB}\n", "user.slice/app.scope/memory.max": "max\n",
         "user.slice/app.scope/memory.events": "oom 0\noom_kill 0\n", "user.slice/memory.events": "oom_kill 7\n"},
        300, 0),
    "v2 in a cgroup namespace: the root is the container's cgroup": (
        "0::/\n", {"memory.max": f"{250 * MB}\n", "memory.events": "oom_kill 1\n"}, 250, 1),
    "hybrid: v1's memory controller": (
        "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/abc\n",
        {"memory/memory.limit_in_bytes": f"{UNLIMITED_V1}\n",
         "memory/docker/abc/memory.limit_in_bytes": f"{150 * MB}\n",
         "memory/docker/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
         "memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 9\n"},
        150, 5),
    "v1 without a cgroup namespace: the host's path, the container's cgroup at the root": (
        "4:memory,hugetlb:/docker/abc\n",
        {"memory/memory.limit_in_bytes": f"{100 * MB}\n", "memory/memory.oom_control": "oom_kill 3\n"}, 100, 3),
    "no /proc/self/cgroup: the roots": (None, {"memory.max": f"{120 * MB}\n"}, 120, None),
    "no cgroup files: the machine": ("0::/app.scope\n", {}, None, None),
}


@pytest.mark.parametrize("case", CGROUPS)
def test_the_memory_limit_and_oom_kills_are_read_in_the_process_own_cgroup(tmp_path, case):
    proc_self_cgroup, files, limit_mb, kills = CGROUPS[case]
    if proc_self_cgroup is not None:
        (tmp_path / "proc" / "self").mkdir(parents=True)
        (tmp_path / "proc" / "self" / "cgroup").write_text(proc_self_cgroup)
    (tmp_path / "sys" / "fs" / "cgroup").mkdir(parents=True)
    for path, text in files.items():
        (tmp_path / "sys" / "fs" / "cgroup" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys" / "fs" / "cgroup" / path).write_text(text)
    machine = psutil.virtual_memory().total
    assert memory_limit_bytes(str(tmp_path)) == (machine if limit_mb is None else min(machine, limit_mb * MB))
    assert oom_kills(str(tmp_path)) == kills
