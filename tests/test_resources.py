"""Running out of disk or shared memory, and deaths that repeat: one line each, what was saved is kept, no hang.

The end-to-end tests give the trainer a tiny tmpfs as --train_dir or as /dev/shm, in a private mount namespace
(`unshare -m`), so nothing outside the test sees it; where the machine does not allow that, they are skipped.
"""

import faulthandler
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from faster_fifo import Empty

from appo.messages import WorkerFailed, WorkerReady
from appo.run.supervisor import EARLY_DEATH_S, Supervisor, signal_cause
from tests.conftest import REPO
from utils.queues import make_queue
from utils.resources import write_failure


def private_tmpfs_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=10)
    return probe.returncode == 0


needs_private_tmpfs = pytest.mark.skipif(not private_tmpfs_works(),
                                         reason="needs root and unshare -m to mount a private tmpfs")


def trainer_on_tmpfs(mount_point: str, size: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """`python -m appo.train ARGS` with a fresh tmpfs of `size` mounted on `mount_point`, seen by this run alone."""
    command = " ".join([f"mount -t tmpfs -o size={size} tmpfs {mount_point} &&", sys.executable, "-m", "appo.train",
                        *args])
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", command], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@needs_private_tmpfs
@pytest.mark.timeout(120)
def test_a_full_disk_costs_checkpoints_not_the_run(tmp_path):
    train_dir = tmp_path / "small"
    train_dir.mkdir()
    # 200 KB: cfg.json, the log and two CartPole checkpoints (70 KB each) fit; the third does not.
    script = (f"mount -t tmpfs -o size=200k tmpfs {train_dir} && "
              f"{sys.executable} -m appo.train --env=CartPole-v1 --experiment=full --train_dir={train_dir} "
              "--train_for_seconds=12 --save_every_sec=1 --keep_checkpoints=2; echo exit=$?; "
              f"{sys.executable} -m appo.train --env=CartPole-v1 --experiment=full --train_dir={train_dir} "
              "--train_for_seconds=16")
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], cwd=REPO,
                            capture_output=True, text=True, timeout=110)
    first, _, second = result.stdout.partition("exit=")
    assert second.startswith("0"), result.stdout[-3000:] + result.stderr[-3000:]
    assert "Logging error" not in result.stdout + result.stderr and "Traceback" not in first
    failures = re.findall(r"checkpoint not saved, training goes on .*: could not write \S+: (.*)", first)
    assert len(failures) == 1 and ("full" in failures[0] or "No space" in failures[0]), first[-3000:]
    assert "Stopped: reached --train_for_seconds=12" in first
    # The newest intact checkpoint the first run kept is the one the second run resumes from.
    kept = re.search(r"p0 checkpoint: (\S+)", first).group(1)
    assert f"resumed from {kept}" in second, second[-3000:]


@needs_private_tmpfs
@pytest.mark.timeout(60)
def test_shared_memory_too_small_for_the_weights_stops_the_run_at_once(tmp_path):
    # A 512-wide MLP's weights take about 1.1 MB; /dev/shm holds 256 KB.
    result = trainer_on_tmpfs("/dev/shm", "256k", "--env=CartPole-v1", "--experiment=shm", f"--train_dir={tmp_path}",
                              "--hidden_size=512", "--train_for_seconds=30", timeout=50)
    assert result.returncode == 1, result.stdout[-3000:]
    line = re.search(r"Run failed: learner_p0 .*", result.stdout)
    assert line is not None, result.stdout[-3000:]
    assert re.search(r"needs [\d.,]+ [KM]B of shared memory, /dev/shm has [\d.,]+ [KM]B free: .*--shm-size",
                     line.group(0)), line.group(0)


def sigbus_after_ready(report_queue, name: str) -> None:
    report_queue.put(WorkerReady(name))
    faulthandler.disable()  # pytest's would print the forked child's stack on the way out
    os.kill(os.getpid(), signal.SIGBUS)


class DiesBySigbus:
    """A worker that reports ready, then dies as a write to a full /dev/shm would."""

    main = staticmethod(sigbus_after_ready)


@pytest.mark.timeout(60)
def test_a_worker_that_dies_the_same_way_twice_at_start_stops_the_run():
    report_queue = make_queue()
    supervisor = Supervisor(report_queue, max_restarts=10)
    supervisor.add("actor_0", "tests.test_resources", "DiesBySigbus", lambda: (report_queue, "actor_0"),
                   cleanup=lambda: None, inbox=make_queue())

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
