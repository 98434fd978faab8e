"""Helpers for tests that run the real trainer as a subprocess, or drive real learners in-process."""

import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import psutil
import pytest
from faster_fifo import Queue

from appo.config.cfg import parse_config
from appo.envs import make_env
from appo.memory.buffers import Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.memory.segments import unlink_segment
from appo.run.result import read_result
from appo.workers.context import Queues, WorkerContext

T = TypeVar("T")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_file(module: str) -> str | None:
    """The file of `module` as Python finds it (appo.envs.atari is envs/atari.py: pyproject's package-dir); None
    when there is no such module."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    return spec.origin if spec is not None else None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true",
                     help="the whole suite, as CI runs it: the quick check and every test marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`python -m pytest` is the quick check: it leaves out the tests marked slow. --full keeps them, and so does an
    explicit -m expression (`-m slow` runs just those)."""
    if config.getoption("--full") or config.option.markexpr:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def leaked_segments(before: set[str]) -> set[str]:
    """New /dev/shm entries, leaving out weight segments of runners still alive (other tests or runs going on now,
    which a segment's name tells: appo_<runner pid>_...)."""
    leaked = set()
    for name in shm_entries() - before:
        match = re.fullmatch(r"appo_(?:test_)?(\d+)_.*", name)  # a run's, or a LearnerRig's (below)
        if match is None or not psutil.pid_exists(int(match.group(1))):
            leaked.add(name)
    return leaked


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def wait_for(condition: Callable[[], T], seconds: float, what: str, interval: float = 0.1,
             details: Callable[[], str] | None = None) -> T:
    """`condition()` once it is truthy, polled every `interval` s; after `seconds` the test fails naming `what`
    (and `details()`, such as a log's tail). Every wait of the tests goes through here: none sleeps a fixed time."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {seconds} s" + (f":\n{details()}" if details else ""))
        time.sleep(interval)


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
        wait_for(lambda: not processes_mentioning(self.train_dir), 5, "end of the run's processes",
                 details=lambda: str(processes_mentioning(self.train_dir)))
        assert leaked_segments(shm_before) == set()


@pytest.fixture
def trainer(tmp_path):
    before = shm_entries()
    runner = Trainer(str(tmp_path / "train_dir"))
    yield runner
    runner.assert_no_leftovers(before)


def final_reward(train_dir: str, experiment: str, policy: int = 0) -> float:
    """The policy's mean episode reward at the end of the run, read from its result.json (appo/run/result.py)."""
    result = read_result(os.path.join(train_dir, experiment))
    reward = result.final_reward(policy)
    assert reward is not None, f"no episode of policy {policy} finished: {result}"
    return reward


class LearnerRig:
    """The shared buffers and queues of a two-policy CartPole run (no processes), with random trajectories in
    every slot; `learner(p)` builds a real learner of policy p over them (again, to play its replacement).
    `flags` replace or add to the rig's (self-play flags are accepted: the cfg is resolved as for two agents)."""

    def __init__(self, exp_dir: str, *flags: str):
        defaults = {"--env": "CartPole-v1", "--num_policies": "2", "--num_workers": "1", "--num_envs_per_worker": "4",
                    "--rollout": "8", "--batch_size": "32", "--num_batches_per_iteration": "1", "--seed": "1",
                    "--device": "cpu"}
        defaults.update(flag.split("=", 1) for flag in flags)
        self.cfg = parse_config([f"{k}={v}" for k, v in defaults.items()], num_agents=2)
        env = make_env(self.cfg.env)
        self.spaces = (env.observation_space, env.action_space)
        self.layout = Layout.from_cfg(self.cfg, *self.spaces)
        policies = self.cfg.num_policies
        snapshots = policies * self.cfg.self_play_opponents
        self.traj = TrajBuffers(self.layout)
        self.control = SharedControl(self.layout, policies, num_snapshots=snapshots)
        self.names = [f"/appo_test_{os.getpid()}_p{p}" for p in range(policies + snapshots)]
        queues = Queues(report=Queue(), learner_inboxes=[Queue() for _ in range(policies)], actor_inboxes=[Queue()])
        self.ctx = WorkerContext(self.cfg, self.layout, self.spaces, self.traj, self.control, queues, self.names,
                                 exp_dir)
        rng = np.random.default_rng(0)
        self.traj.obs["obs"][:] = rng.normal(size=self.traj.obs["obs"].shape)
        self.traj.actions[:] = rng.integers(0, 2, size=self.traj.actions.shape)
        self.traj.rewards[:] = 1.0

    def learner(self, policy: int):
        from appo.learning.learner import Learner

        return Learner(self.ctx, policy)


@pytest.fixture
def learner_rig(tmp_path):
    rig = LearnerRig(str(tmp_path))
    yield rig
    for name in rig.names:
        unlink_segment(name)


@pytest.fixture
def learners(learner_rig):
    """Two real learners of a two-policy CartPole run, and the trajectory buffers they read."""
    return [learner_rig.learner(p) for p in range(2)], learner_rig.traj
