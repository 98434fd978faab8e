"""What every worker process is handed at its start: the run's flags, the shared memory and the queues.

The runner builds one `WorkerContext` (appo/run/graph.py) before it forks the workers; each worker takes what its
role reads from it. A replacement worker gets the same context, so it continues in the same memory.
Torch-free: actors receive it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym

from appo.memory.buffers import Layout, TrajBuffers
from appo.memory.control import SharedControl

Queue = Any  # a faster_fifo.Queue (utils/queues.make_queue)


@dataclass
class Queues:
    """Every queue of the run; each has one reader (the inbox of one consumer), except `report`, which the runner
    reads. What travels in each is in appo/messages.py."""

    report: Queue  # every worker -> the runner
    learner_inboxes: list[Queue]  # per policy: slot hints, PBT messages, weights from a donor
    actor_inboxes: list[Queue]  # per actor worker: wake-ups (on --backend=ray all are the cluster inbox)
    inference_wakeups: list[list[Queue]] = field(default_factory=list)  # [shard][index]: wake-ups
    evaluator_inbox: Queue | None = None  # evaluation requests, with --eval_every_env_steps


@dataclass
class WorkerContext:
    """The wiring of one run (or of one Ray node's sampler group)."""

    cfg: Any  # the run's flags (appo/config/flags.Config), or a role's view of them after `for_role`
    layout: Layout
    spaces: tuple[gym.Space, gym.Space]  # observation and action space of one agent
    traj: TrajBuffers
    control: SharedControl
    queues: Queues
    weights_names: list[str]  # the weights segment of every acting id (appo/memory/segments.py)
    exp_dir: str = ""

    def for_role(self, view: Any) -> WorkerContext:
        """The same wiring with `cfg` narrowed to a role's view of the flags (appo/config/views.py): a worker
        builds it first, so nothing in that process can read a flag its role does not declare."""
        return replace(self, cfg=view.of(self.cfg))

