"""Handing trajectory slots over: from their writer to a learner, and back to the actor that owns them.

`hand_over_slots` is the writer's half: an actor worker (appo/sampling/slots.py), or on a Ray cluster the head's
cluster process, which fills head slots with the nodes' trajectories (appo/run/ray_backend.py). `release_slots` is
the reader's half: a learner (appo/learning/batching.py), or on a Ray node the pull that ships the node's
trajectories to the head. Writes `control.slot_owed` and sends `SlotHint`s and `WAKE`s. Torch-free.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
from faster_fifo import Full

from appo.memory.buffers import Layout
from appo.memory.control import SharedControl
from appo.messages import WAKE


def hand_over_slots(control: SharedControl, learner_inboxes: list, policy: int, slots: list[int]) -> None:
    """Policy `policy`'s learner owes these filled slots a read: set `control.slot_owed` first, then send the hint
    (a `SlotHint`), which only saves the learner from finding them by its periodic scan; a hint that finds the inbox
    full is dropped."""
    control.slot_owed[policy, slots] = 1
    with contextlib.suppress(Full):
        learner_inboxes[policy].put_nowait(slots)


def release_slots(control: SharedControl, layout: Layout, actor_inboxes: list, policies: int | np.ndarray,
                  slots: Sequence[int] | np.ndarray) -> None:
    """Clear `control.slot_owed[policies, slots]` (one policy for all slots, or one per slot) and wake every actor
    that owns one of the slots: an actor that found no free slot sleeps on its inbox until one is released. A
    wake-up that finds the inbox full is dropped; that actor has wake-ups waiting anyway."""
    if len(slots) == 0:
        return
    control.slot_owed[policies, slots] = 0
    for worker in {layout.worker_of_slot(int(slot)) for slot in slots}:
        with contextlib.suppress(Full):
            actor_inboxes[worker].put_nowait(WAKE)
