"""Turn-based (PettingZoo AEC) envs: the adapter on a tiny take-away game and on PettingZoo's connect four and
tic-tac-toe, and the learner's batch, where a seat that waits for its turn makes no sample and trains nothing."""

import numpy as np
import pytest
import torch

from appo.config.cfg import ConfigError, make_config, parse_args, resolve
from appo.config.hyperparams import Hyperparams
from appo.envs import make_env
from appo.envs.action_masks import NoLegalAction
from appo.envs.registry import EnvError
from appo.learning.batching import BatchBuilder
from appo.learning.model import ActorCritic
from appo.learning.policy import make_optimizer
from appo.learning.ppo import ppo_updates, single_steps
from appo.memory.buffers import Layout, TrajBuffers
from appo.sampling.inference_worker import forward_moving
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


def test_a_random_opening_is_legal_seeded_and_never_a_finished_game():
    """Tic-tac-toe after up to 9 random moves: openings that end the game (5 moves and more may) start it again."""
    pytest.importorskip("pettingzoo")
    env = make_env("pettingzoo.classic.tictactoe_v3:env", random_opening_moves=9)
    pieces = []
    for seed in range(60):
        obs, _ = env.reset(seed=seed)
        placed = int(obs["observation"][0].sum())
        movers = np.flatnonzero(obs[MASK_KEY].any(axis=1))
        assert movers.tolist() == [placed % 2]  # the game goes on, and X (seat 0) moves on an even count
        assert obs[MASK_KEY][placed % 2].sum() == 9 - placed  # every empty cell is a legal move
        pieces.append(placed)
    assert env.take_illegal() == 0 and set(pieces) >= {0, 1, 2, 3, 4} and max(pieces) <= 8
    first, _ = env.reset(seed=7)
    again, _ = env.reset(seed=7)
    assert np.array_equal(first["observation"], again["observation"])
    plain, _ = make_env("pettingzoo.classic.tictactoe_v3:env").reset(seed=7)
    assert plain["observation"].sum() == 0  # no openings unless asked: evaluation plays whole games


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


@pytest.mark.parametrize("recompute_advantages", [False, True])
def test_waiting_seats_make_no_samples_and_train_nothing(recompute_advantages):
    cfg = make_config(num_agents=2, env=TAKE_AWAY, rollout=8, batch_size=16, num_envs_per_worker=1,
                      worker_num_splits=1, num_workers=1, ppo_epochs=2, num_batches_per_iteration=2,
                      recompute_advantages=recompute_advantages)
    env = make_env(TAKE_AWAY)
    traj, _ = filled_buffers(cfg, env, cfg.rollout)
    builder = BatchBuilder(cfg, traj, 0, torch.device("cpu"), masked=False, action_masks=True)
    batch = builder.build([0, 1], version=0, min_version=0, gamma=0.99)
    acted = (traj.obs[MASK_KEY][:2, :-1] > 0).any(-1)
    assert batch.own_steps == int(acted.sum()) == cfg.rollout  # one move a step, whichever seat made it
    assert torch.equal(batch.tensors["policy_mask"], torch.as_tensor(acted, dtype=torch.float32))
    hp = Hyperparams.from_cfg(cfg)

    def weights_after_an_iteration(tensors: dict) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = ActorCritic(env.observation_space, env.action_space, cfg)
        optimizer = make_optimizer(model, hp.learning_rate, cfg)
        list(ppo_updates(model, optimizer, cfg, hp, dict(tensors), torch.Generator().manual_seed(0)))
        return [p.detach().clone() for p in model.parameters()]

    # What a waiting step held (its action, log-probability, value) changes nothing: only the moves train.
    waiting = ~torch.as_tensor(acted)
    tensors = batch.tensors
    other = dict(tensors, actions=torch.where(waiting, 1 - tensors["actions"], tensors["actions"]),
                 log_probs=torch.where(waiting, tensors["log_probs"] - 1.0, tensors["log_probs"]),
                 values=torch.where(waiting, tensors["values"] + 5.0, tensors["values"]))
    before = [p.detach().clone() for p in ActorCritic(env.observation_space, env.action_space, cfg).parameters()]
    after, after_other = weights_after_an_iteration(tensors), weights_after_an_iteration(other)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))  # it trained
    for a, b in zip(after, after_other):
        assert torch.equal(a, b)


def test_the_iterations_start_log_probs_cost_a_forward_pass_over_the_moves_alone():
    """--lr_schedule=kl_adaptive takes each trained step's log-probability under the weights an iteration starts with:
    a forward pass over the moves that train, not over the waiting steps as well (half a two-seat game's steps)."""
    env = make_env(TAKE_AWAY)

    def rows_run_through_the_model(lr_schedule: str) -> tuple[int, int, int]:
        cfg = make_config(num_agents=2, env=TAKE_AWAY, rollout=16, batch_size=32, num_envs_per_worker=1,
                          worker_num_splits=1, num_workers=1, ppo_epochs=2, lr_schedule=lr_schedule)
        traj, _ = filled_buffers(cfg, env, cfg.rollout)
        tensors = BatchBuilder(cfg, traj, 0, torch.device("cpu"), masked=False, action_masks=True).build(
            [0, 1], version=0, min_version=0, gamma=0.99).tensors
        moves = int(tensors["policy_mask"].sum())
        model = ActorCritic(env.observation_space, env.action_space, cfg)
        rows, forward_sequence = [], model.forward_sequence
        model.forward_sequence = lambda obs, *args: rows.append(len(obs["observation"])) or forward_sequence(obs, *args)
        hp = Hyperparams.from_cfg(cfg)
        steps = tensors["dones"].numel()
        list(ppo_updates(model, make_optimizer(model, hp.learning_rate, cfg), cfg, hp, tensors))
        return sum(rows), moves, steps

    with_start, moves, steps = rows_run_through_the_model("kl_adaptive")
    without_start, _, _ = rows_run_through_the_model("constant")
    assert 0 < with_start - without_start <= moves < steps


@pytest.mark.parametrize("use_rnn", [False, True])
def test_a_batch_without_a_known_return_trains_nothing(use_rnn):
    """A rollout of 2 steps in a two-seat game, a batch of the second seat's trajectory: it moves once, at the second
    step, and its next turn lies in the next trajectory, so no move has a return yet. The iteration applies no update
    (it crashed on the empty batch of moves)."""
    cfg = make_config(num_agents=2, env=TAKE_AWAY, rollout=2, batch_size=2, num_envs_per_worker=1,
                      worker_num_splits=1, num_workers=1, ppo_epochs=2, use_rnn=use_rnn)
    env = make_env(TAKE_AWAY)
    traj, _ = filled_buffers(cfg, env, cfg.rollout)
    assert not traj.dones[:2, :2].any()  # the game goes on past the trajectory: a pile of 7 takes 4 moves or more
    tensors = BatchBuilder(cfg, traj, 0, torch.device("cpu"), masked=False, action_masks=True).build(
        [1], version=0, min_version=0, gamma=0.99).tensors
    assert tensors["policy_mask"].tolist() == [[0.0, 1.0]]
    model = ActorCritic(env.observation_space, env.action_space, cfg)
    before = [p.detach().clone() for p in model.parameters()]
    hp = Hyperparams.from_cfg(cfg)
    updates = list(ppo_updates(model, make_optimizer(model, hp.learning_rate, cfg), cfg, hp, tensors))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    if not use_rnn:
        assert updates == []  # no minibatch of moves to draw


def test_a_rollout_shorter_than_the_seats_is_refused_for_a_turn_based_game():
    """--rollout=1 in a two-seat game trained only the moves that ended a game: no other has its seat's next turn in
    the trajectory. One line at launch; a rollout of as many steps as seats trains half the moves."""
    with pytest.raises(ConfigError, match=r"^--rollout=1: a move of a game of 2 seats .* use --rollout=2 or more"):
        resolve(parse_args([f"--env={TAKE_AWAY}", "--rollout=1", "--batch_size=8"])[0], 2, turn_based=True)
    assert resolve(parse_args(["--env=CartPole-v1", "--rollout=1", "--batch_size=8"])[0], 1).rollout == 1
    assert resolve(parse_args([f"--env={TAKE_AWAY}", "--rollout=2", "--batch_size=8"])[0], 2, turn_based=True)


def test_a_feed_forward_learner_trains_on_the_moves_alone():
    """After GAE over each seat's moves, the batch the minibatches come from holds the moves whose return is known,
    one step each: about half the steps of a two-seat game."""
    cfg = make_config(num_agents=2, env=TAKE_AWAY, rollout=16, batch_size=32, num_envs_per_worker=1,
                      worker_num_splits=1, num_workers=1)
    traj, _ = filled_buffers(cfg, make_env(TAKE_AWAY), cfg.rollout)
    tensors = BatchBuilder(cfg, traj, 0, torch.device("cpu"), masked=False, action_masks=True).build(
        [0, 1], version=0, min_version=0, gamma=0.99).tensors
    tensors.pop("acting"), tensors.pop("truncated")  # what `ppo_updates` takes out for `losses.turn_gae`
    advantages, targets = torch.randn(2, cfg.rollout), torch.randn(2, cfg.rollout)
    moves, move_advantages, move_targets = single_steps(tensors, advantages, targets, tensors["policy_mask"] > 0)
    rows = tensors["policy_mask"] > 0
    assert len(moves["actions"]) == int(rows.sum()) <= cfg.rollout
    assert torch.equal(moves["actions"][:, 0], tensors["actions"][rows])
    assert torch.equal(moves["obs"]["observation"][:, 0], tensors["obs"]["observation"][:, :-1][rows])
    assert torch.equal(move_advantages[:, 0], advantages[rows]) and torch.equal(move_targets[:, 0], targets[rows])
    assert "mask" not in moves and "policy_mask" not in moves


def test_inference_runs_the_model_for_the_seats_to_move_only():
    cfg = make_config(num_agents=2, env=TAKE_AWAY)
    env = make_env(TAKE_AWAY)
    model = ActorCritic(env.observation_space, env.action_space, cfg).eval()
    obs = {"observation": torch.tensor([[1.0], [0.5], [0.5], [0.25]]),
           MASK_KEY: torch.tensor([[1, 1], [0, 0], [1, 0], [0, 0]], dtype=torch.int8)}
    rnn_states = torch.zeros(4, model.state_size)
    with torch.no_grad():
        all_params, all_values, _ = model.forward_step(obs, rnn_states)
        moving = (obs[MASK_KEY] > 0).any(-1).numpy()
        params, values, _ = forward_moving(model, obs, rnn_states, moving)
        assert torch.allclose(params[moving], all_params[moving]) and torch.allclose(values[moving], all_values[moving])
        assert not params[~moving].any() and not values[~moving].any()
        params, values, _ = forward_moving(model, obs, rnn_states, np.zeros(4, dtype=bool))  # nobody to move
        assert not params.any() and not values.any()
