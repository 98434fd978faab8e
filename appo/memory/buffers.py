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
shared memory, not in messages (`SharedControl.slot_owed`), so a worker that dies loses no slot: a slot
is free when no learner still owes it a read, and a restarted learner finds every trajectory sent to it.
"""

from __future__ import annotations

import math
import mmap
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
