"""The small control arrays every process shares: requests and answers, slot ownership, versions, flags.

They are grouped by the role that writes them, so a reader sees what a process may touch:
`control.actors` is written only by actor workers, `control.inference` only by inference workers,
`control.learners` only by learners, `control.runner` only by the main process. The one exception is
`control.slot_owed`, the hand-over of trajectory slots: an actor sets it, a learner clears it.

The counters publish data written just before them to another process; that relies on stores becoming
visible in program order, which x86-64 guarantees (TSO; docs/ARCHITECTURE.md, "Memory order").
"""

from __future__ import annotations

import numpy as np

from appo.memory.buffers import Layout, shared_array

ENV_CALLS = ("", "make", "reset", "step")  # values of ActorArrays.call
NO_CALL, MAKE, RESET, STEP = range(len(ENV_CALLS))


class ActorArrays:
    """Written by actor workers; read by inference (where to find observations) and the runner (hangs)."""

    def __init__(self, layout: Layout, acting: int):
        shape = (layout.num_workers, layout.num_splits, layout.agents_per_split)
        self.cur_slot = shared_array(shape, np.int64)  # [w, s, j]: the slot env-agent j of split s fills
        self.agent_policy = shared_array(shape, np.int16)  # the acting id for it this episode
        # A split has at most one request outstanding per acting id: the actor writes the step into request_step,
        # then bumps request_count [acting id, worker, split]; inference answers in InferenceArrays.answer_count.
        requests = (acting, layout.num_workers, layout.num_splits)
        self.request_step = shared_array(requests, np.int64)
        self.request_count = shared_array(requests, np.int64)
        # Raised by an actor about to block on its inbox: whoever then gives it work also sends a wake-up.
        self.waiting = shared_array((layout.num_workers,), np.uint8)
        # What each actor is inside right now (ENV_CALLS index, 0 = none), which env, and since when
        # (time.monotonic()): the runner replaces an actor stuck in one env call past --env_timeout_seconds.
        self.call = shared_array((layout.num_workers,), np.uint8)
        self.call_env = shared_array((layout.num_workers,), np.int32)
        self.call_since = shared_array((layout.num_workers,), np.float64)


class InferenceArrays:
    """Written by inference workers; read by the actors they serve."""

    def __init__(self, layout: Layout, acting: int, inference_workers: tuple[int, int]):
        # Answers, [acting id, worker, split]: inference writes the results into the slots, then bumps it.
        self.answer_count = shared_array((acting, layout.num_workers, layout.num_splits), np.int64)
        # [shard, index] (appo/config/topology.py): raised while the worker sleeps on its wake-up queue.
        self.idle = shared_array(inference_workers, np.uint8)


class LearnerArrays:
    """Written by learners; read by inference (new weights), actors (pauses) and the runner (progress)."""

    def __init__(self, num_policies: int, acting: int):
        # Published weights version per acting id; -1 until the first publication (or snapshot); a snapshot's
        # version is that of the policy weights it froze.
        self.policy_version = shared_array((acting,), np.int64)
        self.policy_version[:] = -1
        self.weights_seq = shared_array((acting,), np.int64)  # seqlock of the weights segment (odd while writing)
        # Published with every iteration, so a replacement learner continues from them.
        self.env_steps = shared_array((num_policies,), np.int64)
        self.train_steps = shared_array((num_policies,), np.int64)
        self.pause_collection = shared_array((num_policies,), np.uint8)  # 1: too much unprocessed experience
        # The port where rank 0 of policy p's learner group listens (--learner_processes_per_policy > 1), for the other
        # ranks to meet it; 0 until it listens, and again once the group died (appo/run/roles.py).
        self.group_port = shared_array((num_policies,), np.int32)


class RunnerArrays:
    """Written by the main process only."""

    def __init__(self, num_policies: int, shaping_keys: tuple[str, ...]):
        self.stop = shared_array((1,), np.uint8)  # set once to stop every process
        # Reward-shaping coefficients per policy (PBT sets them; actors hand them to the envs at episode starts).
        self.shaping_keys = tuple(shaping_keys)
        self.reward_shaping = shared_array((num_policies, max(1, len(shaping_keys))), np.float64)


class SharedControl:
    """All control arrays of a run, created by the runner before it forks the workers."""

    def __init__(self, layout: Layout, num_policies: int, inference_workers: tuple[int, int] = (1, 1),
                 shaping_keys: tuple[str, ...] = (), num_snapshots: int = 0):
        """Requests, answers and weights are per acting id: the policies, then `num_snapshots` self-play
        snapshots (appo/config/topology.py); the rest is per learning policy."""
        acting = num_policies + num_snapshots
        self.actors = ActorArrays(layout, acting)
        self.inference = InferenceArrays(layout, acting, inference_workers)
        self.learners = LearnerArrays(num_policies, acting)
        self.runner = RunnerArrays(num_policies, shaping_keys)
        # slot_owed[p, slot] = 1: the slot holds a finished trajectory policy p's learner has not read yet. The actor
        # sets it (before telling the learner), the learner clears it once it has copied the slot; a slot is free for
        # its actor when no policy owes it. Queue messages about slots are only hints.
        self.slot_owed = shared_array((num_policies, layout.num_slots), np.uint8)
