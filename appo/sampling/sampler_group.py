"""A sampler group: actor workers and the inference workers that serve them, over one set of trajectory buffers.

On one machine the group is the whole sampler, next to the learners in the same buffers. On a Ray cluster each node
runs a group of its own, and a collector in place of the learners ships the finished trajectories to the head
(appo/run/ray_backend.py). Either way appo/run/graph.start_sampler starts the group's processes; the group knows
their queues and which actor is stuck in an env call, and watching and replacing them is the supervisor's job. It
writes no shared memory.
"""

from __future__ import annotations

import time

from appo.config.topology import inference_name, inference_shards
from appo.memory.control import ENV_CALLS
from appo.utils.queues import make_queue
from appo.workers.context import WorkerContext


def sampler_queues(cfg) -> tuple[list, list[list]]:
    """A group's inboxes: one per actor worker, and the wake-up queues of the inference workers [shard][index]
    (requests themselves go through shared memory)."""
    actor_inboxes = [make_queue() for _ in range(cfg.num_workers)]
    wakeups = [[make_queue(10_000) for _ in range(cfg.policy_workers_per_policy)] for _ in inference_shards(cfg)]
    return actor_inboxes, wakeups


class SamplerGroup:
    """The actors and inference workers of one machine (started by appo/run/graph.start_sampler)."""

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx
        self.cfg = ctx.cfg

    def queues(self) -> list[tuple[str, object]]:
        """The group's queues with readable names (for the repair after a death, see utils/queues.py)."""
        queues = self.ctx.queues
        named = [(f"actor_{w} inbox", q) for w, q in enumerate(queues.actor_inboxes)]
        named += [(f"{inference_name(self.cfg, shard, i)} wake-up queue", q)
                  for shard, wakeups in enumerate(queues.inference_wakeups) for i, q in enumerate(wakeups)]
        return named

    def kill_hung_actors(self, supervisor) -> None:
        """An actor inside one env call for longer than --env_timeout_seconds is killed (and then replaced)."""
        actors, now = self.ctx.control.actors, time.monotonic()
        for w in range(self.cfg.num_workers):
            call, since = int(actors.call[w]), float(actors.call_since[w])
            if not call or now - since <= self.cfg.env_timeout_seconds:
                continue  # (always so in --serial_mode: the runner looks only between env calls)
            worker = supervisor.workers[f"actor_{w}"]
            if not worker.killed_because:
                supervisor.kill(worker.name, f"stuck for {now - since:.0f} s in env.{ENV_CALLS[call]} of "
                                f"its env {int(actors.call_env[w])} (--env_timeout_seconds="
                                f"{self.cfg.env_timeout_seconds:g})")

    def env_calls(self) -> dict[str, str]:
        """For the stall report: which env call each actor is inside right now, and for how long."""
        actors, now, calls = self.ctx.control.actors, time.monotonic(), {}
        for w in range(self.cfg.num_workers):
            call = int(actors.call[w])
            if call:
                since = now - float(actors.call_since[w])
                calls[f"actor_{w}"] = (f"inside env.{ENV_CALLS[call]} of env {int(actors.call_env[w])} "
                                       f"for {since:.0f} s")
        return calls
