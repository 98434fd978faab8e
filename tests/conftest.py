"""Helpers for tests that run the real trainer as a subprocess."""

import os
import re
import subprocess
import sys
import time

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


class Trainer:
    """Runs `python -m appo.train` in a private train_dir and checks it leaves nothing behind."""

    def __init__(self, train_dir: str):
        self.train_dir = train_dir

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "appo.train", f"--train_dir={self.train_dir}", *args]

    def run(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), cwd=REPO, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def assert_no_leftovers(self, shm_before: set[str]) -> None:
        deadline = time.monotonic() + 5
        while processes_mentioning(self.train_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_mentioning(self.train_dir) == []
        assert shm_entries() - shm_before == set()


@pytest.fixture
def trainer(tmp_path):
    before = shm_entries()
    runner = Trainer(str(tmp_path / "train_dir"))
    yield runner
    runner.assert_no_leftovers(before)


def last_mean_reward(output: str, policy: int = 0) -> float:
    """The mean episode reward of a policy in the trainer's last status line that reports one."""
    rewards = re.findall(rf"p{policy}: [^|]*?reward (-?[0-9.]+) length", output)
    assert rewards, f"no reward reported in:\n{output[-2000:]}"
    return float(rewards[-1])
