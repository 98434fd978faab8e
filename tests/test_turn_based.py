"""Turn-based (PettingZoo AEC) envs: the adapter on a tiny take-away game and on PettingZoo's connect four and
tic-tac-toe, and the learner's batch, where a seat that waits for its turn makes no sample and trains no policy."""

import numpy as np
import pytest
import torch

from appo.config.cfg import make_config
from appo.config.hyperparams import Hyperparams
from appo.envs import make_env
from appo.envs.action_masks import NoLegalAction
from appo.envs.registry import EnvError
from appo.learning.batching import BatchBuilder
from appo.learning.model import ActorCritic
from appo.learning.ppo import minibatch_loss
from appo.memory.buffers import Layout, TrajBuffers
from appo.spaces import MASK_KEY

TAKE_AWAY = "tests.turn_envs:take_away"


def test_only_the_seat_to_move_acts_and_the_game_end_rewards_both():
    env = make_env(TAKE_AWAY, {"pile": 4})
    assert env.num_agents == 2 and env.turn_based
    obs, _ = env.reset(seed=0)
    assert obs[MASK_KEY].tolist() == [[1, 1], [0, 0]]
    inner = env.unwrapped.env
    obs, rewards, terminated, _, _ = env.step([1, 0])  # first takes two; second's action is not its turn's
    assert inner.moves_made == [("first", 1)] and rewards.tolist() == [0, 0] and not terminated
    assert obs[MASK_KEY].tolist() == [[0, 0], [1, 1]]
    obs, rewards, terminated, truncated, _ = env.step([0, 1])  # second takes the last two and wins
    assert inner.moves_made == [("first", 1), ("second", 1)]
    assert rewards.tolist() == [-1, 1] and terminated and not truncated
    assert obs[MASK_KEY].tolist() == [[0, 0], [0, 0]]  # the game is over: nobody moves
    assert env.take_illegal() == 0


def test_an_illegal_move_is_counted_and_a_mover_without_moves_stops_the_run():
    env = make_env(TAKE_AWAY, {"pile": 3})
    env.reset(seed=0)
    env.step([0, 0])
    env.step([0, 1])  # second takes two with two left: allowed
    env.reset(seed=0)
    env.step([0, 0])
    env.step([0, 0])
    env.step([1, 0])  # one stone left: taking two is not allowed
    assert env.take_illegal() == 1
    env = make_env(TAKE_AWAY, {"no_moves_at": 2})
    env.reset(seed=0)
    env.step([0, 0])
    with pytest.raises(NoLegalAction, match=rf"--env={TAKE_AWAY}: first's turn at move 2 of a game, and its action "
                                            "mask allows no action"):
        env.step([0, 0])


def test_an_env_without_masks_gets_them_and_continuous_actions_are_refused():
    env = make_env(TAKE_AWAY, {"masks": False})
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"obs", MASK_KEY} and obs[MASK_KEY].tolist() == [[1, 1], [0, 0]]
    with pytest.raises(EnvError, match=rf"--env={TAKE_AWAY}: .*Discrete or MultiDiscrete"):
        make_env(TAKE_AWAY, {"continuous": True})
    with pytest.raises(EnvError, match="--action_mask=none cannot apply"):
        make_env(TAKE_AWAY, action_mask="none")


def test_connect_four_through_the_adapter():
    pytest.importorskip("pettingzoo")
    env = make_env("pettingzoo.classic.connect_four_v3:env")
    obs, _ = env.reset(seed=0)
    assert obs["observation"].shape == (2, 6, 7, 2) and obs[MASK_KEY].tolist() == [[1] * 7, [0] * 7]
    moves = [0, 1, 0, 1, 0, 1]
    for k, column in enumerate(moves):
        obs, rewards, terminated, _, _ = env.step([column, column])
        mover = (k + 1) % 2
        assert obs[MASK_KEY][mover].all() and not obs[MASK_KEY][1 - mover].any() and not terminated
    # Each seat sees the board from its side: plane 0 its own pieces.
    assert obs["observation"][0, 5, 0, 0] == 1 and obs["observation"][1, 5, 0, 1] == 1
    _, rewards, terminated, _, _ = env.step([0, 0])  # four in column 0
    assert terminated and rewards.tolist() == [1, -1] and env.take_illegal() == 0


def test_tictactoe_draw_gives_both_seats_zero():
    pytest.importorskip("pettingzoo")
    env = make_env("pettingzoo.classic.tictactoe_v3:env")
    env.reset(seed=0)
    total = np.zeros(2)
    for cell in (0, 4, 8, 1, 7, 6, 2, 5, 3):  # a drawn game
        _, rewards, terminated, truncated, _ = env.step([cell, cell])
        total += rewards
    assert terminated and not truncated and total.tolist() == [0, 0]


# ---------------------------------------------------------------------------------------------- learning
def filled_buffers(cfg, env, steps: int, seed: int = 0) -> tuple[TrajBuffers, Layout]:
    """One slot per seat of one take-away env, filled with `steps` moves of random play."""
    layout = Layout.from_cfg(cfg, env.observation_space, env.action_space, env.num_agents)
    traj = TrajBuffers(layout)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    for t in range(steps + 1):
        traj.write_obs(np.arange(2), t, obs)
        if t == steps:
            break
        actions = [int(rng.integers(2)) if mask.any() and mask[1] else 0 for mask in obs[MASK_KEY]]
        traj.actions[:2, t] = actions
        obs, rewards, terminated, _, _ = env.step(actions)
        traj.rewards[:2, t] = rewards
        traj.dones[:2, t] = 1 if terminated else 0
        if terminated:
            obs, _ = env.reset()
    return traj, layout


def test_waiting_seats_make_no_samples_and_train_the_value_head_only():
    cfg = make_config(num_agents=2, env=TAKE_AWAY, rollout=8, batch_size=16, num_envs_per_worker=1,
                      worker_num_splits=1, num_workers=1)
    env = make_env(TAKE_AWAY)
    traj, _ = filled_buffers(cfg, env, cfg.rollout)
    model = ActorCritic(env.observation_space, env.action_space, cfg)
    builder = BatchBuilder(cfg, traj, 0, torch.device("cpu"), masked=False, action_masks=True)
    batch = builder.build([0, 1], version=0, min_version=0, gamma=0.99)
    acted = (traj.obs[MASK_KEY][:2, :-1] > 0).any(-1)
    assert batch.own_steps == int(acted.sum()) == cfg.rollout  # one move a step, whichever seat made it
    assert torch.equal(batch.tensors["policy_mask"], torch.as_tensor(acted, dtype=torch.float32))

    tensors = batch.tensors
    tensors["bootstrap"] = torch.zeros(2)
    advantages, targets = torch.randn(2, cfg.rollout), torch.randn(2, cfg.rollout)
    hp = Hyperparams.from_cfg(cfg)

    def policy_gradient(actions: torch.Tensor, advantages: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        mb = dict(tensors, actions=actions)
        _, _, stats = minibatch_loss(model, cfg, hp, mb, advantages, targets)
        stats["policy_loss"].backward()
        return [p.grad.clone() for p in model.policy_head.parameters()]

    # What a waiting step held (its action, its advantage) changes nothing in the policy's gradient.
    waiting = ~torch.as_tensor(acted)
    other_actions = torch.where(waiting, 1 - tensors["actions"], tensors["actions"])
    other_advantages = torch.where(waiting, advantages + 10.0, advantages)
    for a, b in zip(policy_gradient(tensors["actions"], advantages), policy_gradient(other_actions, other_advantages)):
        assert torch.allclose(a, b, atol=1e-6)
