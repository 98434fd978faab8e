"""Every role a worker process can have, in one table (at the end): the class that runs it, and what the supervisor
cleans up after one of its workers dies. appo/run/graph.py says which workers of each role a run starts.

A role's class is named ("module:Class"), not imported here: the learner, the evaluator and inference import
torch, and the runner, which forks every worker, must not (tests/test_layout.py, tests/test_train.py). `Role.load`
imports it where the role runs: in the worker's own process (appo/run/supervisor.start_component), or in the
runner with --serial_mode (appo/run/serial.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from appo.memory.control import SharedControl
from appo.workers.context import WorkerContext


class WorkerRole:
    """What every role's class (actor, inference, learner, evaluator, the Ray cluster process) is: `setup()`, then
    `step(timeout)` until the run stops, then `close()`. A step does one round of the role's work and blocks at
    most `timeout` seconds, so the same object runs in its own process (`run`) or, with --serial_mode, is stepped
    by the runner in the main process (appo/run/serial.py). A step that raises ends the process with the traceback
    (the supervisor reports it); `close()` runs when the run stops. The class's `main(ctx, ...)` is the entry point
    of the role's process."""

    STEP_TIMEOUT_S = 0.05  # how long a step may block in the role's own process
    control: SharedControl

    def run(self) -> None:
        self.setup()
        while not self.control.runner.stop[0]:
            self.step(self.STEP_TIMEOUT_S)
        self.close()

    def setup(self) -> None:
        raise NotImplementedError

    def step(self, timeout: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Role:
    """One role: the prefix of its workers' names (restart counts are per role), its class, and what to clean up
    after one of its workers died, before the replacement starts into the same shared memory."""

    name: str
    entry_point: str  # "package.module:Class": a WorkerRole whose main(*args) runs the process
    # Called with the arguments the dead worker's `main` got: lowers the shared-memory flags it may have left raised.
    after_death: Callable[..., None]

    def load(self) -> type[WorkerRole]:
        """The role's class (importing its module, torch with it for some roles)."""
        module, _, name = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), name)


def lower_learner_flags(ctx: WorkerContext, policy_id: int, *_) -> None:
    """A learner that died with minibatches waiting left its actors paused; its replacement starts with none."""
    ctx.control.learners.pause_collection[policy_id] = 0


def lower_inference_flags(ctx: WorkerContext, shard: int, index: int) -> None:
    """An inference worker that died asleep left itself marked idle: actors must stop sending wake-ups to a queue
    nobody reads."""
    ctx.control.inference.idle[shard, index] = 0


def lower_actor_flags(ctx: WorkerContext, worker: int) -> None:
    """An actor that died waiting for free slots, or inside an env call, left that marked (the stall report and the
    hang check read both)."""
    ctx.control.actors.waiting[worker] = 0
    ctx.control.actors.call[worker] = 0


def nothing_to_lower(*_) -> None:
    """The evaluator, a learner rank above 0 and the cluster process raise no flag that another process waits on."""


# The roles. After `ctx`, each class's main(ctx, ...) takes: the learner its policy, its PBT hyper-parameters and
# whether to report iterations; a learner rank (--learner_processes_per_policy > 1) its policy and rank; the evaluator
# the agents per env; inference its shard and index; an actor its number; the cluster process the env. Which workers
# of each a run starts: appo/run/graph.py.
LEARNER = Role("learner", "appo.learning.learner:Learner", lower_learner_flags)
LEARNER_RANK = Role("learner_rank", "appo.learning.learner_rank:LearnerRank", nothing_to_lower)
EVALUATOR = Role("evaluator", "appo.learning.evaluator:Evaluator", nothing_to_lower)
INFERENCE = Role("inference", "appo.sampling.inference_worker:InferenceWorker", lower_inference_flags)
ACTOR = Role("actor", "appo.sampling.actor_worker:ActorWorker", lower_actor_flags)
CLUSTER = Role("cluster", "appo.run.ray_backend:Cluster", nothing_to_lower)
