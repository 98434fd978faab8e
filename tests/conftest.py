"""Helpers for tests that run the real trainer as a subprocess, or drive real learners in-process."""

import importlib.util
import os
import re
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from faster_fifo import Queue

from appo.config.cfg import parse_config
from appo.envs import make_env
from appo.memory.buffers import Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.memory.segments import unlink_segment
from appo.workers.context import Queues, WorkerContext

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_file(module: str) -> str | None:
    """The file of `module` as Python finds it (appo.envs.atari is envs/atari.py: pyproject's package-dir); None
    when there is no such module."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    return spec.origin if spec is not None else None


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


def wait_for(condition, seconds: float, what: str):
    """`condition()` once it is truthy, polled until `seconds` pass (then the test fails naming `what`)."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {seconds} s")
        time.sleep(0.1)


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
    """The mean episode reward of a policy in the trainer's last status that reports one."""
    rewards = re.findall(rf"\bp{policy}: v\d+, reward (-?[0-9.]+) length", output)
    assert rewards, f"no reward reported in:\n{output[-2000:]}"
    return float(rewards[-1])


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
