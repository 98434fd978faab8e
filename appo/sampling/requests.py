"""The actor's side of asking for actions: request counters out, answer counters in, and the wake-ups around them.

To ask acting id p for split s's actions, the actor writes the step into control.actors.request_step[p, w, s],
then bumps request_count[p, w, s]; the inference worker writes the results into the slots, then bumps
control.inference.answer_count[p, w, s]. Each counter has one writer, and no message is sent unless the other side
sleeps: an idle inference worker (control.inference.idle) gets a WAKE; an actor with nothing to step raises
control.actors.waiting and waits on its inbox for one.

Writes: control.actors.request_step, request_count and waiting. Sends: WAKE to idle inference workers. Torch-free.
"""

from __future__ import annotations

import contextlib

from faster_fifo import Empty, Full

from appo.config.topology import inference_shard_of
from appo.messages import WAKE
from appo.workers.context import WorkerContext


class ActionRequests:
    """One actor worker's requests per split: which acting ids it asked last, and whether all have answered."""

    def __init__(self, ctx: WorkerContext, worker: int):
        control, cfg = ctx.control, ctx.cfg
        self.worker, self.actors, self.idle = worker, control.actors, control.inference.idle
        self.inbox = ctx.queues.actor_inboxes[worker]
        # This worker is served by inference worker `worker % policy_workers_per_policy` of each shard.
        self.inference_index = worker % cfg.policy_workers_per_policy
        self.inference_wakeups = [queues[self.inference_index] for queues in ctx.queues.inference_wakeups]
        self.inference_shard = inference_shard_of(cfg)  # per acting id
        self.request_count = control.actors.request_count[:, worker]  # [acting id, split] views
        self.answer_count = control.inference.answer_count[:, worker]
        self.acting: list[list[int]] = [[] for _ in range(ctx.layout.num_splits)]  # asked at each split's last request

    def answered(self, s: int) -> bool:
        """Whether every acting id asked at split s's last request has written its actions."""
        return all(self.answer_count[p, s] == self.request_count[p, s] for p in self.acting[s])

    def request(self, s: int, t: int, acting: list[int]) -> None:
        """Ask every acting id in `acting` for split s's actions at step t; wake the idle inference workers."""
        self.acting[s] = acting
        actors, w = self.actors, self.worker
        for policy in acting:
            actors.request_step[policy, w, s] = t
            actors.request_count[policy, w, s] += 1  # publishes the request: written last
            shard = self.inference_shard[policy]
            if self.idle[shard, self.inference_index]:
                with contextlib.suppress(Full):  # a full queue has wake-ups enough
                    self.inference_wakeups[shard].put_nowait(WAKE)

    def wait_for_answers(self, timeout: float) -> None:
        """Wait on the inbox until an inference worker wakes this actor (or the timeout passes)."""
        self.actors.waiting[self.worker] = 1
        if not any(self.answered(s) for s in range(len(self.acting))):  # an answer may predate the flag
            self.wait_for_wakeup(timeout)
        self.actors.waiting[self.worker] = 0

    def wait_for_wakeup(self, timeout: float) -> None:
        """Wait until a wake-up comes (or the timeout passes; 0: only empty the inbox). What comes is only WAKE:
        from inference (actions are written) or from a learner (it has read slots of this worker)."""
        with contextlib.suppress(Empty):
            self.inbox.get_many(block=timeout > 0, timeout=timeout)
