"""A sampler group: actor workers and the inference workers that serve them, over one set of trajectory buffers.

On one machine the group is the whole control, next to the learners in the same buffers (appo/run/runner.py). On a
Ray cluster each node runs a group of its own, and a collector in its place of the learners ships the finished
trajectories to the head (appo/run/ray_backend.py). Either way the group only registers its processes with a
`Supervisor` and knows their queues and shared-memory flags; watching and replacing them is the supervisor's job.
"""

from __future__ import annotations

import time

from appo.config.topology import inference_name, inference_shards
from appo.memory.buffers import Layout, TrajBuffers
from appo.memory.control import ENV_CALLS, SharedControl
from appo.run.supervisor import Supervisor
from utils.queues import make_queue


class SamplerGroup:
    def __init__(self, cfg, layout: Layout, spaces, traj: TrajBuffers, control: SharedControl, learner_inboxes: list,
                 report_queue, weights_names: list[str]):
        """`learner_inboxes[p]` is where actors send ("traj", slots) hints for policy p; `weights_names[id]` the
        weights segment of every acting id."""
        self.cfg, self.layout, self.spaces = cfg, layout, spaces
        self.traj, self.control = traj, control
        self.learner_inboxes, self.report_queue, self.weights_names = learner_inboxes, report_queue, weights_names
        self.actor_inboxes = [make_queue() for _ in range(cfg.num_workers)]
        # Wake-up queues of the inference workers, [group][index]; requests themselves go through memory.
        self.inference_queues = [[make_queue(10_000) for _ in range(cfg.policy_workers_per_policy)]
                                 for _ in inference_shards(cfg)]

    def queues(self) -> list[tuple[str, object]]:
        """The group's queues with readable names (for the repair after a death, see utils/queues.py)."""
        named = [(f"actor_{w} inbox", q) for w, q in enumerate(self.actor_inboxes)]
        named += [(f"{inference_name(self.cfg, g, i)} wake-up queue", q)
                  for g, queues in enumerate(self.inference_queues) for i, q in enumerate(queues)]
        return named

    def start(self, supervisor: Supervisor) -> None:
        """Start the inference workers, then the actors; each with the flags its death may leave raised."""
        cfg, layout, control = self.cfg, self.layout, self.control
        for g in range(len(self.inference_queues)):
            for i in range(cfg.policy_workers_per_policy):
                supervisor.add(inference_name(cfg, g, i), "appo.sampling.inference_worker", "run_inference_worker",
                               lambda g=g, i=i: (cfg, layout, self.spaces, g, i, self.traj, control,
                                                 self.inference_queues[g][i], self.actor_inboxes, self.report_queue,
                                                 self.weights_names),
                               # actors must stop sending wake-ups to a queue nobody reads
                               cleanup=lambda g=g, i=i: control.inference.idle.__setitem__((g, i), 0),
                               inbox=self.inference_queues[g][i])
        for w in range(cfg.num_workers):
            supervisor.add(f"actor_{w}", "appo.sampling.actor_worker", "run_actor_worker", lambda w=w: (
                cfg, layout, w, self.traj, control, self.actor_inboxes[w], self.inference_queues,
                self.learner_inboxes, self.report_queue),
                cleanup=lambda w=w: (control.actors.waiting.__setitem__(w, 0), control.actors.call.__setitem__(w, 0)),
                inbox=self.actor_inboxes[w])

    def kill_hung_actors(self, supervisor: Supervisor) -> None:
        """An actor inside one env call for longer than --env_timeout_seconds is killed (and then replaced)."""
        control, now = self.control, time.monotonic()
        for w in range(self.cfg.num_workers):
            call, since = int(control.actors.call[w]), float(control.actors.call_since[w])
            worker = supervisor.workers[f"actor_{w}"]
            if call and now - since > self.cfg.env_timeout_seconds and not worker.killed_because:
                supervisor.kill(worker.name, f"stuck for {now - since:.0f} s in env.{ENV_CALLS[call]} of "
                                f"its env {int(control.actors.call_env[w])} (--env_timeout_seconds="
                                f"{self.cfg.env_timeout_seconds:g})")

    def env_calls(self) -> dict[str, str]:
        """For the stall report: which env call each actor is inside right now, and for how long."""
        now, calls = time.monotonic(), {}
        for w in range(self.cfg.num_workers):
            call = int(self.control.actors.call[w])
            if call:
                since = now - float(self.control.actors.call_since[w])
                calls[f"actor_{w}"] = (f"inside env.{ENV_CALLS[call]} of env "
                                       f"{int(self.control.actors.call_env[w])} for {since:.0f} s")
        return calls
