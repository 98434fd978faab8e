"""Every role a worker process can have, in one table (at the end): the class that runs it, and what the supervisor
cleans up after one of its workers dies. appo/run/graph.py says which workers of each role a run starts.

Each role's class is imported inside a small function of its own (`_learner` and so on), not at the top: the
learner, the evaluator and inference import torch, and the runner, which forks every worker, must not
(tests/test_layout.py, tests/test_train.py). `Role.load` calls it where the role runs: in the worker's own process
(appo/run/supervisor.start_component), or in the runner with --serial_mode (appo/run/serial.py). The imports are
plain ones, so grep, an IDE and tests/test_layout.py see every edge. The table lives in appo/run, the top layer,
because it names classes of every layer below (sampling, learning, and the run's own Ray cluster process).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from appo.workers.context import WorkerContext
from appo.workers.roles import WorkerRole


@dataclass(frozen=True)
class Role:
    """One role: the prefix of its workers' names (restart counts are per role), its class, and what to clean up
    after one of its workers died, before the replacement starts into the same shared memory."""

    name: str
    # Imports and returns the role's class, a WorkerRole whose main(*args) runs the process (torch with it for some).
    load: Callable[[], type[WorkerRole]]
    # Called with the arguments the dead worker's `main` got: lowers the shared-memory flags it may have left raised.
    after_death: Callable[..., None]


def lower_learner_flags(ctx: WorkerContext, policy_id: int, *_) -> None:
    """A learner that died with minibatches waiting left its actors paused; its replacement starts with none. Its
    learner group's port is gone with it (`forget_group_port`)."""
    ctx.control.learners.pause_collection[policy_id] = 0
    forget_group_port(ctx, policy_id)


def forget_group_port(ctx: WorkerContext, policy_id: int, *_) -> None:
    """A learner group restarts together, every member's clean-up first: the port its dead rank 0 published must not
    be where a new rank looks for the new rank 0 (it may be closed, or another run's by now)."""
    ctx.control.learners.group_port[policy_id] = 0


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
    """The evaluator and the cluster process raise no flag that another process waits on."""


def _learner() -> type[WorkerRole]:
    from appo.learning.learner import Learner

    return Learner


def _learner_rank() -> type[WorkerRole]:
    from appo.learning.learner_rank import LearnerRank

    return LearnerRank


def _evaluator() -> type[WorkerRole]:
    from appo.learning.evaluator import Evaluator

    return Evaluator


def _inference() -> type[WorkerRole]:
    from appo.sampling.inference_worker import InferenceWorker

    return InferenceWorker


def _actor() -> type[WorkerRole]:
    from appo.sampling.actor_worker import ActorWorker

    return ActorWorker


def _cluster() -> type[WorkerRole]:
    from appo.run.ray_backend import Cluster

    return Cluster


# The roles. After `ctx`, each class's main(ctx, ...) takes: the learner its policy, its PBT hyper-parameters and
# whether to report iterations; a learner rank (--learner_processes_per_policy > 1) its policy and rank; the evaluator
# the agents per env; inference its shard and index; an actor its number; the cluster process the env. Which workers
# of each a run starts: appo/run/graph.py.
LEARNER = Role("learner", _learner, lower_learner_flags)
LEARNER_RANK = Role("learner_rank", _learner_rank, forget_group_port)
EVALUATOR = Role("evaluator", _evaluator, nothing_to_lower)
INFERENCE = Role("inference", _inference, lower_inference_flags)
ACTOR = Role("actor", _actor, lower_actor_flags)
CLUSTER = Role("cluster", _cluster, nothing_to_lower)
