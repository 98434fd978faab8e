"""A trainer run watched from outside while it runs, for scripts/chaos.py and scripts/soak.py: `python -m appo.train`
as a child process, its status lines (env steps and policy 0's mean reward, each with the moment it was printed: the
course of the run, which no file holds with the moment it was shown), and its worker processes by name (every worker
names itself after its role: actor_0, inference_0, learner_p0, ...). How the run ended is its result.json
(`WatchedRun.result`)."""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import psutil

from appo.run.result import RunResult, read_result
from appo.tools.trainer_process import experiment_dir_of

STATUS = re.compile(r"env steps (\d+)")  # the progress line of a status
REWARD = re.compile(r"\bp0: v\d+, reward (-?[0-9.]+) length")  # policy 0's line of it, just after


def save_json(path: str, data: object) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


@dataclass
class Sample:
    t: float  # seconds since launch
    env_steps: int
    reward: float | None


class StatusReader:
    """Turns the trainer's status lines into samples: env steps from a progress line, then the reward of the line
    after it."""

    def __init__(self):
        self.samples: list[Sample] = []

    def feed(self, line: str, t: float) -> None:
        """One line of the trainer's output, read `t` seconds after launch."""
        status = STATUS.search(line)
        reward = REWARD.search(line)
        if status:
            self.samples.append(Sample(t, int(status.group(1)), None))
        elif reward and self.samples:
            self.samples[-1].reward = float(reward.group(1))


class WatchedRun:
    """`python -m appo.train ARGS`, launched at once; its output is read in a thread as it comes."""

    def __init__(self, trainer_args: list[str]):
        self.exp_dir = experiment_dir_of(trainer_args)
        self.launched = time.monotonic()
        self.process = subprocess.Popen([sys.executable, "-m", "appo.train", *trainer_args], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.status = StatusReader()
        self.samples = self.status.samples
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            self.status.feed(line, self.elapsed())

    def elapsed(self) -> float:
        return time.monotonic() - self.launched

    def workers(self) -> dict[str, psutil.Process]:
        found = {}
        for child in psutil.Process(self.process.pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                found[child.name()] = child
        return found

    def wait(self) -> int:
        code = self.process.wait()
        self.reader.join()
        return code

    # ---------------------------------------------------------------- measures
    def fps(self, start: float | None = None, end: float | None = None) -> float:
        """Env steps per second between the status lines nearest to start and end (default: first steps to the
        last line)."""
        moving = [s for s in self.samples if s.env_steps > 0]
        if start is not None:
            moving = [s for s in moving if s.t >= start]
        if end is not None:
            moving = [s for s in moving if s.t <= end]
        if len(moving) < 2:
            return 0.0
        return (moving[-1].env_steps - moving[0].env_steps) / (moving[-1].t - moving[0].t)

    def steady_fps(self, window: float = 5.0) -> float:
        """Median throughput over consecutive windows, from the first env steps on."""
        moving = [s for s in self.samples if s.env_steps > 0]
        if not moving:
            return 0.0
        rates, t = [], moving[0].t
        while t + window <= moving[-1].t:
            rates.append(self.fps(t, t + window))
            t += window
        return statistics.median(rates) if rates else self.fps()

    def first_reward_at_least(self, target: float) -> float | None:
        return next((s.t for s in self.samples if s.reward is not None and s.reward >= target), None)

    def lowest_reward_after(self, target: float) -> float | None:
        """The lowest mean reward printed after the first one to reach target."""
        reached = self.first_reward_at_least(target)
        if reached is None:
            return None
        return min(s.reward for s in self.samples if s.t >= reached and s.reward is not None)

    def last_count(self, label: str) -> int:
        """The last value of a count the status line shows as "<label> N" (0 if never shown)."""
        for line in reversed(self.lines):
            match = re.search(rf"{label} (\d+)", line)
            if match:
                return int(match.group(1))
        return 0

    def result(self) -> RunResult:
        """How the run ended (after `wait`)."""
        return read_result(self.exp_dir)
