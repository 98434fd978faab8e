"""The trajectory slots of one actor worker: which are free, taking them for a split, handing them to the learners.

A worker owns the slots `layout.worker_slots(worker)`. A slot is *in use* while a split of this worker fills it
(known only to this process) and *owed* while a learner has not read the trajectory in it yet
(`control.slot_owed`, shared memory); it is free when neither. Because what the learners owe lives in shared
memory, a replacement started after a crash leaves alone every slot its predecessor handed over.

Writes: control.slot_owed (sets policy p's flag of a slot it hands over; p's learner clears it once read).
Sends: a `SlotHint` to the inbox of each learner it hands slots to. Reads: traj.policy_ids (who acted in a slot),
control.learners.pause_collection and policy_version. Torch-free.
"""

from __future__ import annotations

import numpy as np

from appo.config.topology import lockstep, num_acting_ids, trajectories_per_iteration
from appo.memory.slots import hand_over_slots
from appo.workers.context import WorkerContext


class SlotAllocator:
    """Which of one worker's slots are free or in use; takes free ones for a split and hands filled ones over.

    Waiting for free slots is the worker's: `take` gives up at once when too few are free, and the worker retries
    after a wake-up (learners send one when they release slots of this worker)."""

    def __init__(self, ctx: WorkerContext, worker: int):
        cfg, layout, control = ctx.cfg, ctx.layout, ctx.control
        slots = layout.worker_slots(worker)
        self.first = slots.start
        self.control = control
        self.owed = control.slot_owed[:, slots.start:slots.stop]  # this worker's columns
        self.in_use = np.zeros(len(slots), dtype=bool)  # indexed from `first`
        self.policy_ids = ctx.traj.policy_ids
        self.learner_inboxes = ctx.queues.learner_inboxes
        self.num_policies = cfg.num_policies
        self.single_acting = num_acting_ids(cfg) == 1
        self.pause_collection = control.learners.pause_collection
        self.policy_version = control.learners.policy_version
        # In lockstep (appo/config/topology.py) a split waits at its rollout end until the learner has trained on
        # every full iteration handed over; counted from the weights version at the first hand-over.
        self.lockstep = lockstep(cfg)
        self.per_iteration = trajectories_per_iteration(cfg)
        self.handed_over = 0
        self.base_version = 0

    def free(self) -> np.ndarray:
        """This worker's slots that no split fills and no learner owes a read."""
        return self._free() + self.first

    def _free(self) -> np.ndarray:
        return np.flatnonzero(~(self.owed.any(axis=0) | self.in_use))

    def take(self, n: int) -> np.ndarray | None:
        """n free slots, now in use; None (and nothing taken) when fewer are free."""
        free = self._free()
        if len(free) < n:
            return None
        taken = free[:n]
        self.in_use[taken] = True
        return taken + self.first

    def hand_over(self, filled: np.ndarray) -> None:
        """Give filled slots to the learners: the learner of every policy that acted in a slot owes it a read
        (`slot_owed`, set first); the hint that follows only saves the learner from finding it by its periodic
        scan. The slots are no longer in use: free again once every learner has read them."""
        if self.handed_over == 0:
            self.base_version = int(self.policy_version[0])
        self.handed_over += len(filled)
        if self.single_acting:
            sent = [(0, filled.tolist())]
        else:
            present = [set(self.policy_ids[slot].tolist()) for slot in filled]
            sent = [(policy, [int(slot) for slot, policies in zip(filled, present) if policy in policies])
                    for policy in range(self.num_policies)]
        for policy, slots in sent:
            if slots:
                hand_over_slots(self.control, self.learner_inboxes, policy, slots)
        self.in_use[filled - self.first] = False

    def collection_paused(self, policies: list[int]) -> bool:
        """Whether a learner of these learning policies asked the actors to pause (too much unprocessed
        experience), or, in lockstep, has not yet trained on every full iteration handed over to it."""
        if self.pause_collection[policies].any():
            return True
        expected = self.base_version + self.handed_over // self.per_iteration  # one version per iteration
        return self.lockstep and int(self.policy_version[0]) < expected
