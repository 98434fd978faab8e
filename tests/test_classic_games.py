"""The scripted players of appo.envs.classic_games on hand-built boards and in PettingZoo's real connect four and
tictactoe, play_games' seats and illegal-move accounting, and the errors of `python -m appo.versus`."""

import importlib.util

import numpy as np
import pytest

from appo.envs.classic_games import (
    COLUMNS,
    ROWS,
    Record,
    Tactics,
    connect_four_lookahead,
    landing_row,
    play_games,
    random_player,
    read_board,
    scripted_player,
    tictactoe_perfect,
)
from appo.tools.versus import main, player_by_name
from tests.conftest import REPO

needs_pettingzoo = pytest.mark.skipif(importlib.util.find_spec("pettingzoo") is None, reason="pettingzoo not installed")


def connect_four_obs(own: list[tuple[int, int]], opponent: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """An observation dict as PettingZoo's connect four gives the mover: (row, column) cells, row 0 the top."""
    planes = np.zeros((ROWS, COLUMNS, 2), dtype=np.int8)
    for r, c in own:
        planes[r, c, 0] = 1
    for r, c in opponent:
        planes[r, c, 1] = 1
    mask = (planes[0].sum(axis=1) == 0).astype(np.int8)
    return {"observation": planes, "action_mask": mask}


def tictactoe_obs(own: list[int], opponent: list[int]) -> dict[str, np.ndarray]:
    """A tictactoe observation dict; cell i is observation[i // 3, i % 3]."""
    planes = np.zeros((3, 3, 2), dtype=np.int8)
    for i in own:
        planes[i // 3, i % 3, 0] = 1
    for i in opponent:
        planes[i // 3, i % 3, 1] = 1
    mask = (planes.sum(axis=2).reshape(9) == 0).astype(np.int8)
    return {"observation": planes, "action_mask": mask}


def choices(player, observation, tries=30) -> set[int]:
    return {player(observation, np.random.default_rng(seed)) for seed in range(tries)}


def test_lookahead_takes_an_immediate_win():
    horizontal = connect_four_obs(own=[(5, 0), (5, 1), (5, 2)], opponent=[(4, 0), (4, 1), (4, 2)])
    assert choices(connect_four_lookahead, horizontal) == {3}
    vertical = connect_four_obs(own=[(5, 6), (4, 6), (3, 6)], opponent=[(5, 0), (5, 1), (4, 0)])
    assert choices(connect_four_lookahead, vertical) == {6}
    # Diagonal up to the right, completed at (2, 3): column 3 holds three pieces, so a drop lands on row 2.
    diagonal = connect_four_obs(own=[(5, 0), (4, 1), (3, 2), (5, 2), (4, 3)],
                                opponent=[(5, 1), (4, 2), (5, 3), (3, 3)])
    assert choices(connect_four_lookahead, diagonal) == {3}


def test_lookahead_prefers_its_win_to_a_block():
    observation = connect_four_obs(own=[(5, 0), (5, 1), (5, 2)], opponent=[(5, 6), (4, 6), (3, 6)])
    assert choices(connect_four_lookahead, observation) == {3}


def test_lookahead_blocks_an_immediate_threat():
    vertical = connect_four_obs(own=[(5, 0), (5, 1)], opponent=[(5, 4), (4, 4), (3, 4)])
    assert choices(connect_four_lookahead, vertical) == {4}
    horizontal = connect_four_obs(own=[(4, 1), (4, 2)], opponent=[(5, 1), (5, 2), (5, 3)])
    assert choices(connect_four_lookahead, horizontal) == {0, 4}


def test_lookahead_drops_to_the_lowest_empty_row():
    # Three in a row on row 4 with (5, 3) empty: a piece in column 3 lands on row 5 and wins nothing, so neither side
    # has a winning column and the move is random.
    observation = connect_four_obs(own=[(4, 0), (4, 1), (4, 2), (5, 1)], opponent=[(5, 0), (5, 2)])
    assert landing_row(read_board(observation), 3) == 5
    assert len(choices(connect_four_lookahead, observation)) > 1
    full = connect_four_obs(own=[(r, 0) for r in range(0, ROWS, 2)], opponent=[(r, 0) for r in range(1, ROWS, 2)])
    assert landing_row(read_board(full), 0) is None
    assert 0 not in choices(connect_four_lookahead, full)


@needs_pettingzoo
def test_board_reading_matches_pettingzoo_connect_four():
    from pettingzoo.classic import connect_four_v3

    env = connect_four_v3.env()
    env.reset(seed=0)
    for column in (3, 3, 4, 0, 5):  # player_0: 3, 4, 5; player_1: 3 (on top), 0
        env.step(column)
    board = read_board(env.observe("player_1"))  # player_1 to move: plane 0 is its pieces
    expected = np.zeros((ROWS, COLUMNS), dtype=np.int8)
    expected[5, [3, 4, 5]] = 2
    expected[4, 3] = expected[5, 0] = 1
    np.testing.assert_array_equal(board, expected)
    assert landing_row(board, 3) == 3 and landing_row(board, 1) == 5
    # player_1 must block column 2 or 6; then player_0 wins through the other one, and the env says so.
    block = connect_four_lookahead(env.observe("player_1"), np.random.default_rng(0))
    assert block in (2, 6)
    env.step(block)
    win = connect_four_lookahead(env.observe("player_0"), np.random.default_rng(0))
    assert win == 8 - block
    env.step(win)
    assert env.terminations["player_0"] and env.rewards == {"player_0": 1, "player_1": -1}


@needs_pettingzoo
def test_tictactoe_cell_order_matches_pettingzoo():
    from pettingzoo.classic import tictactoe_v3

    env = tictactoe_v3.env()
    env.reset(seed=0)
    env.step(1)  # player_1
    env.step(5)  # player_2
    observation = env.observe("player_1")
    assert observation["observation"][0, 1, 0] == 1 and observation["observation"][1, 2, 1] == 1
    assert observation["observation"].sum() == 2
    np.testing.assert_array_equal(observation["action_mask"], [1, 0, 1, 1, 1, 0, 1, 1, 1])
    env.step(0)
    env.step(6)
    # player_1 holds 0 and 1: the perfect player completes the line 0-1-2 and the env scores it.
    move = tictactoe_perfect(env.observe("player_1"), np.random.default_rng(0))
    assert move == 2
    env.step(move)
    assert env.terminations["player_1"] and env.rewards == {"player_1": 1, "player_2": -1}


def test_tictactoe_perfect_wins_and_blocks_on_hand_built_boards():
    assert choices(tictactoe_perfect, tictactoe_obs(own=[0, 1], opponent=[3, 4])) == {2}
    assert choices(tictactoe_perfect, tictactoe_obs(own=[1], opponent=[0, 4])) == {8}
    # Against a corner opening only the centre draws; every other reply loses.
    assert choices(tictactoe_perfect, tictactoe_obs(own=[], opponent=[0])) == {4}
    # The empty board: every opening draws, and the choice among them is random.
    assert len(choices(tictactoe_perfect, tictactoe_obs(own=[], opponent=[]))) > 3


def test_random_player_plays_only_legal_actions():
    observation = tictactoe_obs(own=[0, 4], opponent=[8, 2])
    assert choices(random_player, observation, tries=100) == {1, 3, 5, 6, 7}


@needs_pettingzoo
def test_tictactoe_perfect_never_loses():
    against_random = play_games("tictactoe", tictactoe_perfect, random_player, games=200, seed=1)
    assert against_random.losses == 0 and against_random.illegal == 0 and against_random.games == 200
    assert against_random.wins > 100
    against_itself = play_games("tictactoe", tictactoe_perfect, tictactoe_perfect, games=200, seed=2)
    assert against_itself == Record(wins=0, draws=200, losses=0, illegal=0)


@needs_pettingzoo
def test_lookahead_beats_random_at_connect_four():
    record = play_games("connect_four", connect_four_lookahead, random_player, games=200, seed=3)
    assert record.win_rate >= 0.9 and record.illegal == 0 and record.games == 200
    # The record is the first player's: with the lookahead second, the same games read as losses.
    mirrored = play_games("connect_four", random_player, connect_four_lookahead, games=50, seed=4)
    assert mirrored.losses >= 45 and mirrored.win_rate <= 0.1


def test_tactics_count_wins_taken_and_threats_blocked_on_hand_built_boards():
    win_and_threat = connect_four_obs(own=[(5, 0), (5, 1), (5, 2)], opponent=[(5, 6), (4, 6), (3, 6)])
    assert Tactics().after(win_and_threat, 3) == Tactics(wins_offered=1, wins_taken=1)
    assert Tactics().after(win_and_threat, 6) == Tactics(wins_offered=1)  # the block is no win: a win was missed
    threat = connect_four_obs(own=[(5, 0), (5, 1)], opponent=[(5, 4), (4, 4), (3, 4)])
    assert Tactics().after(threat, 4) == Tactics(threats=1, blocks=1)
    assert Tactics().after(threat, 0).after(threat, 4) == Tactics(threats=2, blocks=1)
    quiet = connect_four_obs(own=[(5, 0)], opponent=[(5, 6)])
    assert Tactics().after(quiet, 3) == Tactics()


@needs_pettingzoo
def test_play_games_counts_the_first_players_tactics():
    """The lookahead takes every win and blocks every threat it meets; random play misses most."""
    lookahead = play_games("connect_four", connect_four_lookahead, random_player, games=100, seed=5).tactics
    assert lookahead.wins_offered > 50 and lookahead.wins_taken == lookahead.wins_offered
    assert lookahead.threats > 5 and lookahead.blocks == lookahead.threats
    random = play_games("connect_four", random_player, connect_four_lookahead, games=100, seed=5).tactics
    assert random.wins_offered > 10 and random.wins_taken < 0.6 * random.wins_offered
    assert random.threats > 50 and random.blocks < random.threats / 2
    assert play_games("tictactoe", random_player, random_player, games=10, seed=5).tactics == Tactics()


@needs_pettingzoo
@pytest.mark.parametrize("game", ["connect_four", "tictactoe"])
def test_play_games_alternates_seats(game):
    moved_first = {"first": [], "second": []}

    def recording(name):
        def player(observation, rng):
            if not observation["observation"].any():  # an empty board: this player opens the game
                moved_first[name].append(True)
            return random_player(observation, rng)
        return player

    record = play_games(game, recording("first"), recording("second"), games=10, seed=0)
    assert record.games == 10
    assert len(moved_first["first"]) == len(moved_first["second"]) == 5


@needs_pettingzoo
@pytest.mark.parametrize("game", ["connect_four", "tictactoe"])
def test_illegal_actions_are_counted_and_the_game_finishes(game):
    calls = []
    bad = [99, -1, 2.0, None, np.int64(-3)]

    def illegal_player(observation, rng):
        calls.append(1)
        taken = np.flatnonzero(observation["action_mask"] == 0)  # an occupied cell or a full column, when there is one
        return int(taken[0]) if len(calls) % 2 and len(taken) else bad[len(calls) % len(bad)]

    record = play_games(game, illegal_player, random_player, games=4, seed=0)
    assert record.games == 4
    assert record.illegal == len(calls) > 0
    numpy_ints = play_games(game, lambda obs, rng: np.int64(random_player(obs, rng)), random_player, games=4, seed=0)
    assert numpy_ints.illegal == 0


@needs_pettingzoo
def test_play_games_starts_a_stateful_player_anew_and_shows_it_the_opponents_moves():
    """A StatefulPlayer gets new_game before every game and, on each of the opponent's moves, its own observation with
    a mask that allows nothing (what training's recurrent inference sees on a waiting step)."""
    events, opponent_moves = [], []

    class Stateful:
        def __call__(self, observation, rng):
            events.append("move")
            return random_player(observation, rng)

        def new_game(self):
            events.append("new_game")

        def wait(self, observation):
            assert not observation["action_mask"].any() and observation["observation"].shape == (3, 3, 2)
            events.append("wait")

    def opponent(observation, rng):
        opponent_moves.append(1)
        return random_player(observation, rng)

    record = play_games("tictactoe", Stateful(), opponent, games=4, seed=0)
    assert record.games == 4 and events.count("new_game") == 4
    assert events.count("wait") == len(opponent_moves)
    games = "".join("|" if e == "new_game" else e[0] for e in events).split("|")[1:]
    assert [game[0] for game in games] == ["m", "w", "m", "w"]  # the player opens games 0 and 2, waits first in 1, 3


@needs_pettingzoo
def test_a_recurrent_policy_starts_every_game_from_a_zero_state(tmp_path):
    """As in training: the state is zero at each game's first step, and steps on the opponent's moves as well."""
    from tests.test_after_training import make_experiment

    exp_dir = make_experiment(tmp_path, "rnn", "--env=pettingzoo.classic.tictactoe_v3:env", "--use_rnn=True")
    player = player_by_name(exp_dir, "tictactoe")
    policy, act = player.policy, player.policy.act
    calls = []  # (state before the call, whether the policy was to move)

    def recording_act(obs, deterministic=False):
        state = policy.rnn_states
        calls.append((None if state is None else state.clone(), bool(obs["action_mask"].any())))
        return act(obs, deterministic)

    policy.act = recording_act
    opponent_moves = []

    def opponent(observation, rng):
        opponent_moves.append(1)
        return random_player(observation, rng)

    record = play_games("tictactoe", player, opponent, games=3, seed=0)
    assert record.games == 3 and record.illegal == 0
    assert sum(not moving for _, moving in calls) == len(opponent_moves)  # a step on every opponent's move
    fresh = [state is None or not state.any() for state, _ in calls]
    assert sum(fresh) == 3 and fresh[0], fresh  # zero at each game's start, never in a game's middle


@needs_pettingzoo
def test_play_games_is_reproducible():
    one = play_games("connect_four", random_player, random_player, games=20, seed=5)
    assert play_games("connect_four", random_player, random_player, games=20, seed=5) == one


def test_player_by_name():
    assert player_by_name("lookahead", "connect_four") is connect_four_lookahead
    assert player_by_name("perfect", "tictactoe") is tictactoe_perfect
    assert player_by_name("random", "tictactoe") is random_player
    with pytest.raises(ValueError, match="random, lookahead"):
        player_by_name("perfect", "connect_four")
    with pytest.raises(ValueError, match="unknown game"):
        scripted_player("random", "chess")


@pytest.mark.parametrize("argv, flag, valid", [
    (["--game", "tictactoe", "--first", "lookahead", "--second", "random"], "--first", "random, perfect"),
    (["--game", "connect_four", "--first", "random", "--second", "nobody"], "--second", "random, lookahead"),
    (["--game", "chess", "--first", "random", "--second", "random"], "--game", "'connect_four', 'tictactoe'"),
])
def test_cli_bad_name_exits_2_with_one_line(argv, flag, valid, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert flag in err and valid in err


@needs_pettingzoo
def test_cli_prints_one_line(capsys):
    assert main(["--game", "tictactoe", "--first", "perfect", "--second", "perfect", "--games", "4"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "tictactoe perfect vs perfect, 4 games (seed 0): wins 0, draws 4, losses 0, win rate 0.000, illegal 0"]


@needs_pettingzoo
@pytest.mark.timeout(120)
def test_cli_refuses_a_policy_trained_on_another_env_in_one_line(trainer, capsys):
    done = trainer.run("--env=CartPole-v1", "--experiment=cartpole", "--serial_mode=True", "--num_workers=1",
                       "--num_envs_per_worker=2", "--train_for_env_steps=1000")
    assert done.returncode == 0, done.stderr[-2000:]
    exp_dir = f"{trainer.train_dir}/cartpole"
    assert main(["--game", "tictactoe", "--first", exp_dir, "--second", "random"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert "a policy of --env=CartPole-v1 sees {'obs': (4,)}, not tictactoe's" in err


def score_checkpoints_main():
    spec = importlib.util.spec_from_file_location("score_checkpoints", f"{REPO}/scripts/score_checkpoints.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded.main


@pytest.mark.parametrize("argv, expected", [
    (["{tmp}/nope"], "{tmp}/nope: no cfg.json, so not the experiment dir of a run"),
    (["{tmp}/empty"], "{tmp}/empty: no checkpoint"),
    (["--minutes", "-1", "--", "{tmp}/empty"], "argument --minutes: must be 0 or more, got -1"),
    (["--games", "0", "{tmp}/empty"], "argument --games: must be at least 1, got 0"),
])
def test_score_checkpoints_refuses_bad_input_in_one_line(tmp_path, argv, expected, capsys):
    """scripts/score_checkpoints.py: a dir that is no run, a run without checkpoints, negative minutes, no games."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "cfg.json").write_text("{}")
    main = score_checkpoints_main()
    assert main(["--game", "connect_four", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert expected.format(tmp=tmp_path) in err
