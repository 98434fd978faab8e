"""Shared buffers: indexing round trips between numpy (actors) and torch (inference, learner) across fork."""

import multiprocessing

import gymnasium as gym
import numpy as np
import torch

from appo.config.cfg import make_config
from appo.memory.buffers import Layout, TrajBuffers, shared_array
from appo.memory.control import SharedControl


def small_layout(**overrides) -> Layout:
    cfg = dict(num_workers=2, num_envs_per_worker=4, worker_num_splits=2, num_policies=1, rollout=4,
               batch_size=8, num_batches_per_iteration=1, num_minibatches_to_accumulate=1,
               min_traj_buffers_per_worker=2, use_rnn=True, rnn_type="lstm", hidden_size=3,
               actor_critic_share_weights=True)
    cfg.update(overrides)
    obs = gym.spaces.Box(0, 255, (2, 3), np.uint8)
    return Layout.from_cfg(make_config(env="CartPole-v1", **cfg), obs, gym.spaces.Box(-1, 1, (2,), np.float32))


def _child_writes(traj: TrajBuffers, control: SharedControl) -> None:
    traj.write_obs(5, 2, np.arange(6, dtype=np.uint8).reshape(2, 3))
    traj.actions[5, 1] = [0.25, -0.5]
    traj.rnn_states[3, 4] = 7.0
    control.actors.cur_slot[1, 0, 1] = 5


def test_layout_sizes_and_ownership():
    layout = small_layout()
    assert layout.agents_per_split == 2
    assert layout.obs["obs"] == ((2, 3), np.uint8) and layout.rnn_size == 6
    assert layout.slots_per_worker >= 2 * 4
    for w in range(2):
        assert all(layout.worker_of_slot(s) == w for s in layout.worker_slots(w))


def test_writes_in_a_forked_child_are_seen_by_torch_views():
    layout = small_layout()
    traj, control = TrajBuffers(layout), SharedControl(layout, 1)
    child = multiprocessing.get_context("fork").Process(target=_child_writes, args=(traj, control))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    views = traj.torch_views()
    assert views["obs"]["obs"].dtype == torch.uint8
    assert views["obs"]["obs"][5, 2].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert views["actions"][5, 1].tolist() == [0.25, -0.5]
    assert torch.all(views["rnn_states"][3, 4] == 7.0)
    # Fancy indexing by (slot, step) pairs, as inference does, finds the same cells.
    slots = torch.from_numpy(control.actors.cur_slot[1, 0, 1:2].copy())
    assert views["obs"]["obs"][slots, torch.tensor([2])].tolist() == [[[0, 1, 2], [3, 4, 5]]]
    # And a torch write is visible through numpy (same memory, no copy).
    views["log_probs"][7, 3] = -1.5
    assert traj.log_probs[7, 3] == -1.5


def test_shared_array_is_zeroed_with_requested_shape():
    array = shared_array((3, 4), np.int16)
    assert array.shape == (3, 4) and array.dtype == np.int16 and not array.any()
