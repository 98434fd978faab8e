"""Preallocated shared-memory buffers: trajectories, sampler control arrays, per-policy counters.

All bulk data lives in anonymous shared mappings created by the runner before it forks the workers,
so every process sees the same memory, nothing is pickled on the hot path, and no `/dev/shm` entry
exists to leak. Actor workers use the numpy views; the learner wraps the same memory as torch tensors
without copies (`torch_views`); inference gathers each batch through numpy (cheaper for small index sets)
and hands torch only the gathered batch.

Trajectory slot layout (`num_slots` slots, `T = --rollout`):

    obs[key]        [slot, T+1, *shape]       per observation key; step T is the bootstrap observation
    rnn_states      [slot, T+1, rnn_size]     state *before* each step (zeroed after an episode end)
    actions         [slot, T, *action_shape]
    log_probs       [slot, T]                 behaviour policy log-probability of the action
    values          [slot, T]                 behaviour value estimate
    rewards         [slot, T]                 the env's reward (the learner scales and clips it)
    dones           [slot, T]                 0, or TERMINATED / TRUNCATED when the episode ended with this step
    policy_versions [slot, T]                 version of the weights that chose the action
    policy_ids      [slot, T]                 which policy acted (agents are re-mapped per episode)

Slots belong to actor workers in contiguous ranges, `slots_per_worker` each. Who holds a slot is kept in
shared memory, not in messages (`SamplerState.slot_owed`), so a worker that dies loses no slot: a slot
is free when no learner still owes it a read, and a restarted learner finds every trajectory sent to it.
"""

from __future__ import annotations

import _posixshmem  # CPython's POSIX shm_open/shm_unlink, used by multiprocessing.shared_memory itself
import contextlib
import math
import mmap
import os
import re
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from appo.spaces import action_layout, obs_as_dict, obs_dtype, obs_spaces

# Done codes: the learner treats both as episode ends, and credits V(s_t) at a time-limit truncation.
TERMINATED, TRUNCATED = 1, 2
# Longest sleep of an actor or inference worker on its queue while it has nothing to do. A wake-up can be
# missed when one side raises its flag (actor_waiting, inference_idle) at the instant the other checks
# it (a store and a load may pass each other between cores); this bounds the delay.
WAKE_TIMEOUT_S = 0.002


def shared_array(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A zero-filled numpy array in an anonymous MAP_SHARED mapping, shared with forked children."""
    dtype = np.dtype(dtype)
    nbytes = max(1, math.prod(shape) * dtype.itemsize)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    return np.frombuffer(memory, dtype=dtype, count=math.prod(shape)).reshape(shape)


def rnn_size(cfg) -> int:
    """Floats of recurrent state per agent (LSTM keeps h and c; separate actor and critic cores keep one
    state each); 1 placeholder for feed-forward models."""
    if not cfg.use_rnn:
        return 1
    return cfg.hidden_size * (2 if cfg.rnn_type == "lstm" else 1) * (1 if cfg.actor_critic_share_weights else 2)


@dataclass(frozen=True)
class Layout:
    """Sizes every process derives identically from the cfg and the env spaces."""

    num_workers: int
    num_splits: int
    num_agents: int  # per env
    agents_per_split: int  # env-agents stepped together in one split
    rollout: int
    slots_per_worker: int
    obs: dict[str, tuple[tuple[int, ...], np.dtype]]  # per observation key: shape and dtype
    action_shape: tuple[int, ...]
    action_dtype: np.dtype
    rnn_size: int

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.slots_per_worker

    @staticmethod
    def from_cfg(cfg, obs_space: gym.Space, action_space: gym.Space, num_agents: int = 1) -> Layout:
        agents_per_worker = cfg.num_envs_per_worker * num_agents
        # Enough slots for every env-agent to fill one while earlier ones wait at the learners: a full
        # iteration plus the backlog a learner may accumulate before it pauses the actors.
        minibatches = cfg.num_batches_per_iteration + cfg.num_minibatches_to_accumulate
        backlog = cfg.num_policies * minibatches * cfg.batch_size // cfg.rollout
        slots_per_worker = max(
            cfg.min_traj_buffers_per_worker * agents_per_worker,
            agents_per_worker + math.ceil(backlog / cfg.num_workers),
        )
        action_shape, action_dtype = action_layout(action_space)
        return Layout(
            num_workers=cfg.num_workers,
            num_splits=cfg.worker_num_splits,
            num_agents=num_agents,
            agents_per_split=agents_per_worker // cfg.worker_num_splits,
            rollout=cfg.rollout,
            slots_per_worker=slots_per_worker,
            obs={key: (tuple(space.shape), obs_dtype(space)) for key, space in obs_spaces(obs_space).items()},
            action_shape=action_shape,
            action_dtype=action_dtype,
            rnn_size=rnn_size(cfg),
        )

    def worker_slots(self, worker: int) -> range:
        return range(worker * self.slots_per_worker, (worker + 1) * self.slots_per_worker)

    def worker_of_slot(self, slot: int) -> int:
        return slot // self.slots_per_worker


class TrajBuffers:
    """The trajectory slots (see module docstring), one shared array per field."""

    FIELDS = ("obs", "rnn_states", "actions", "log_probs", "values", "rewards", "dones",
              "policy_versions", "policy_ids")

    def __init__(self, layout: Layout):
        n, t = layout.num_slots, layout.rollout
        self.obs = {key: shared_array((n, t + 1, *shape), dtype) for key, (shape, dtype) in layout.obs.items()}
        self.rnn_states = shared_array((n, t + 1, layout.rnn_size), np.float32)
        self.actions = shared_array((n, t, *layout.action_shape), layout.action_dtype)
        self.log_probs = shared_array((n, t), np.float32)
        self.values = shared_array((n, t), np.float32)
        self.rewards = shared_array((n, t), np.float32)
        self.dones = shared_array((n, t), np.uint8)
        self.policy_versions = shared_array((n, t), np.int64)
        self.policy_ids = shared_array((n, t), np.int16)

    def write_obs(self, slots, t: int, obs) -> None:
        """Store an env's observation (array, or dict for Dict spaces) at step t of the given slot(s)."""
        for key, value in obs_as_dict(obs).items():
            self.obs[key][slots, t] = value

    def copy_obs(self, to_slots: np.ndarray, to_t: int, from_slots: np.ndarray, from_t: int) -> None:
        for array in self.obs.values():
            array[to_slots, to_t] = array[from_slots, from_t]

    def torch_views(self) -> dict:
        """The same memory as torch tensors (no copy), `obs` as a dict; only for processes that use torch."""
        import torch

        views = {name: torch.from_numpy(getattr(self, name)) for name in self.FIELDS if name != "obs"}
        views["obs"] = {key: torch.from_numpy(array) for key, array in self.obs.items()}
        return views


class SamplerState:
    """Small control arrays shared by actors, inference workers and learners.

    `cur_slot[w, s, j]` is the slot env-agent j of split s of worker w is filling; `agent_policy` is the
    policy acting for it this episode. Inference workers read both to find where a request's
    observations are and where to write the actions.

    The counters below publish data written just before them to another process; that relies on stores
    becoming visible in program order, which x86-64 guarantees (TSO).
    """

    ENV_CALLS = ("", "make", "reset", "step")  # values of actor_call

    def __init__(self, layout: Layout, num_policies: int, inference_workers: tuple[int, int] = (1, 1),
                 shaping_keys: tuple[str, ...] = (), num_snapshots: int = 0):
        """Requests, answers and weights are per acting id: the policies, then `num_snapshots` self-play
        snapshots (appo/matchmaking.py); the rest is per learning policy."""
        acting = num_policies + num_snapshots
        shape = (layout.num_workers, layout.num_splits, layout.agents_per_split)
        self.cur_slot = shared_array(shape, np.int64)
        self.agent_policy = shared_array(shape, np.int16)
        # Requests for actions and their answers, per (policy, worker, split). A split has at most one
        # request outstanding per policy: the actor writes the step into request_step, then bumps
        # request_count; inference writes the results into the slots, then bumps answer_count. Each
        # counter has one writer, and no queue message is needed unless the other side sleeps.
        requests = (acting, layout.num_workers, layout.num_splits)
        self.request_step = shared_array(requests, np.int64)
        self.request_count = shared_array(requests, np.int64)
        self.answer_count = shared_array(requests, np.int64)
        # Raised by a worker about to block on its queue: whoever then gives it work also sends a wake-up.
        self.actor_waiting = shared_array((layout.num_workers,), np.uint8)
        self.inference_idle = shared_array(inference_workers, np.uint8)  # [group, index] (cfg.inference_groups)
        # Published weight version per acting id; -1 until the learner has published its first weights (or taken
        # the snapshot); a snapshot's version is that of the policy weights it froze.
        self.policy_version = shared_array((acting,), np.int64)
        self.policy_version[:] = -1
        # Seqlock counter guarding the weights buffer (odd while the learner is writing).
        self.weights_seq = shared_array((acting,), np.int64)
        # slot_owed[p, slot] = 1: the slot holds a finished trajectory that policy p's learner has not read yet.
        # The actor sets it (before telling the learner) and the learner clears it once it has copied the slot;
        # a slot is free for its actor when no policy owes it. Queue messages about slots are only hints.
        self.slot_owed = shared_array((num_policies, layout.num_slots), np.uint8)
        # What each actor is inside right now (ENV_CALLS index, 0 = none), which env, and since when
        # (time.monotonic()): the runner replaces an actor stuck in one env call past --env_timeout_seconds.
        self.actor_call = shared_array((layout.num_workers,), np.uint8)
        self.actor_call_env = shared_array((layout.num_workers,), np.int32)
        self.actor_call_since = shared_array((layout.num_workers,), np.float64)
        # Counters a learner publishes with every iteration, so its replacement continues from them.
        self.learner_env_steps = shared_array((num_policies,), np.int64)
        self.learner_train_steps = shared_array((num_policies,), np.int64)
        # Set by the runner to stop every process.
        self.stop = shared_array((1,), np.uint8)
        # 1 while the learner of a policy has too much unprocessed experience.
        self.pause_collection = shared_array((num_policies,), np.uint8)
        # Reward-shaping coefficients per policy (PBT sets them; actors hand them to the envs at episode starts).
        self.shaping_keys = tuple(shaping_keys)
        self.reward_shaping = shared_array((num_policies, max(1, len(shaping_keys))), np.float64)


# Named segments exist only for published weights, whose size only the learner (torch) knows. They
# are used without multiprocessing.shared_memory, whose resource tracker would start an extra process
# in each worker; the runner, which names them, unlinks them at shutdown.


def weights_segment_name(run_token: str, policy_id: int) -> str:
    """Name of the segment a learner publishes its weights in (see appo.weights); the run token starts with
    the runner's pid."""
    return f"/appo_{run_token}_p{policy_id}"


def remove_orphan_segments(directory: str = "/dev/shm") -> list[str]:
    """Unlink weight segments whose runner is gone (a runner killed with -9 cannot unlink its own); returns
    their names. A segment whose pid belongs to a live process is left alone."""
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in os.listdir(directory):
        match = re.fullmatch(r"appo_(\d+)_[0-9a-f]+_p\d+", name)
        if match and not _pid_alive(int(match.group(1))):
            unlink_segment(f"/{name}")
            removed.append(name)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def create_segment(name: str, nbytes: int) -> mmap.mmap:
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def open_segment(name: str, nbytes: int) -> mmap.mmap:
    """Create the segment, or attach to it when a predecessor of the caller (a learner that died) made it."""
    try:
        return create_segment(name, nbytes)
    except FileExistsError:
        return attach_segment(name)


def write_weights(sampler: SamplerState, acting_id: int, copy_in, version: int) -> None:
    """The seqlock's write side for one acting id's weights segment: the counter is odd while `copy_in()` fills
    the segment, then the version is published (readers: `read_weights`)."""
    seq = sampler.weights_seq
    seq[acting_id] += 1
    copy_in()
    seq[acting_id] += 1
    sampler.policy_version[acting_id] = version


def read_weights(sampler: SamplerState, acting_id: int, copy_out):
    """The seqlock's read side: `copy_out()` (which copies the segment) is retried until no write overlapped it;
    returns what the last call returned."""
    seq = sampler.weights_seq
    while True:
        before = int(seq[acting_id])
        if before % 2 == 0:
            copied = copy_out()
            if int(seq[acting_id]) == before:
                return copied
        time.sleep(0.0001)


def attach_segment(name: str) -> mmap.mmap:
    fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def unlink_segment(name: str) -> None:
    """Remove a segment if it exists."""
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink(name)
