"""Scripted opponents for PettingZoo's connect_four_v3 and tictactoe_v3, and games played between two players.

A player is a function of one agent's observation dict (what `env.observe(agent)` returns for the agent to move:
"observation" planes, plane 0 the mover's pieces and plane 1 the opponent's, and "action_mask") and a numpy Generator;
it returns a legal action. A `StatefulPlayer` (a recurrent policy) is also told of each new game and shown the
opponent's moves.
- `random_player`: uniform over the legal actions.
- `connect_four_lookahead`: wins at once when it can, else blocks a column where the opponent would win on its next
  move, else plays a random legal move (ties broken at random).
- `tictactoe_perfect`: memoised minimax; a uniformly random choice among the optimal moves (faster wins and slower
  losses score higher), so games vary. It never loses.

`play_games` plays whole games of the AEC env, the two players changing seats every game, and returns a `Record`
from the first player's point of view (on connect four with its one-move `Tactics`: wins taken, threats
blocked). Measured with `python -m appo.versus` (pettingzoo 1.27):

    python -m appo.versus --game connect_four --first lookahead --second random --games 1000 --seed 0
    connect_four lookahead vs random, 1000 games (seed 0): wins 965, draws 3, losses 32, win rate 0.965, illegal 0;
    lookahead: wins taken 965 of 965, threats blocked 905 of 905
    python -m appo.versus --game tictactoe --first perfect --second random --games 1000 --seed 0
    tictactoe perfect vs random, 1000 games (seed 0): wins 863, draws 137, losses 0, win rate 0.863, illegal 0
    python -m appo.versus --game tictactoe --first perfect --second perfect --games 1000 --seed 0
    tictactoe perfect vs perfect, 1000 games (seed 0): wins 0, draws 1000, losses 0, win rate 0.000, illegal 0

This module imports pettingzoo (an optional dependency) only when games are played.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

Player = Callable[[dict[str, np.ndarray], np.random.Generator], int]


@runtime_checkable
class StatefulPlayer(Protocol):
    """A player that carries state through a game (a recurrent policy). `play_games` calls `new_game` before each
    game's first move and `wait` with the player's observation, its mask allowing nothing, on each of the opponent's
    moves: training runs a recurrent model on its seat's every step, from a zero state at each game's start."""

    def __call__(self, observation: dict[str, np.ndarray], rng: np.random.Generator) -> int: ...

    def new_game(self) -> None: ...

    def wait(self, observation: dict[str, np.ndarray]) -> None: ...


GAMES = ("connect_four", "tictactoe")
ROWS, COLUMNS = 6, 7
# Tictactoe cells: action i is observation[i // 3, i % 3]. PettingZoo reshapes its flat list of squares row-major
# (its docs draw the indices column by column; the winning lines are the same either way).
TICTACTOE_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
OWN, OPPONENT = 1, 2  # the cell values of boards read from the observation planes (0 is empty)


def legal_actions(observation: dict[str, np.ndarray]) -> np.ndarray:
    """The actions the mask allows, in order; raises ValueError on an all-zero mask, which PettingZoo gives every agent
    but the one to move: a player handed it was asked out of turn."""
    legal = np.flatnonzero(observation["action_mask"])
    if legal.size == 0:
        raise ValueError("the action mask allows no action: this observation is not of the agent to move")
    return legal


def random_player(observation: dict[str, np.ndarray], rng: np.random.Generator) -> int:
    """Uniform over the legal actions: the baseline every other player should beat."""
    return int(rng.choice(legal_actions(observation)))


def read_board(observation: dict[str, np.ndarray]) -> np.ndarray:
    """The board as one int8 array, OWN (1) for the mover's pieces, OPPONENT (2) for the other's, 0 for empty; from the
    planes only, so the scripted players see exactly what a learned policy sees."""
    planes = np.asarray(observation["observation"])
    return (planes[..., 0] * OWN + planes[..., 1] * OPPONENT).astype(np.int8)


def landing_row(board: np.ndarray, column: int) -> int | None:
    """The row a piece dropped in `column` comes to rest on (row 0 is the top, so the largest empty row); None when
    the column is full."""
    empty = np.flatnonzero(board[:, column] == 0)
    return int(empty[-1]) if empty.size else None


def connects_four(board: np.ndarray, row: int, column: int, piece: int) -> bool:
    """Whether `piece` at (row, column) makes four in a row, counting the cell itself as `piece` whatever the board
    holds there: a move is checked without copying the board."""
    for d_row, d_column in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * d_row, column + sign * d_column
            while 0 <= r < ROWS and 0 <= c < COLUMNS and board[r, c] == piece:
                count += 1
                r, c = r + sign * d_row, c + sign * d_column
        if count >= 4:
            return True
    return False


def winning_columns(board: np.ndarray, piece: int, columns: Sequence[int]) -> list[int]:
    """The columns among `columns` where dropping `piece` wins at once."""
    wins = []
    for column in columns:
        row = landing_row(board, int(column))
        if row is not None and connects_four(board, row, int(column), piece):
            wins.append(int(column))
    return wins


def connect_four_lookahead(observation: dict[str, np.ndarray], rng: np.random.Generator) -> int:
    """One step of lookahead: a win now, else a block of the opponent's win on its next move, else random. Enough to
    beat a random player nearly always, and still weak enough that a trained policy has to learn to set up threats."""
    legal = legal_actions(observation)
    board = read_board(observation)
    for piece in (OWN, OPPONENT):
        columns = winning_columns(board, piece, legal)
        if columns:
            return int(rng.choice(columns))
    return int(rng.choice(legal))


def _tictactoe_wins(cells: tuple[int, ...], piece: int) -> bool:
    return any(cells[a] == cells[b] == cells[c] == piece for a, b, c in TICTACTOE_LINES)


def _tictactoe_move_score(cells: tuple[int, ...], action: int) -> int:
    """The minimax score of the mover (OWN) playing `action`: 1 + the empty cells left for a win (faster wins score
    more), 0 for a draw, the negated score of the opponent's best reply otherwise."""
    after = cells[:action] + (OWN,) + cells[action + 1:]
    empty = after.count(0)
    if _tictactoe_wins(after, OWN):
        return 1 + empty
    if empty == 0:
        return 0
    swapped = tuple(OPPONENT if v == OWN else OWN if v == OPPONENT else 0 for v in after)
    return -_tictactoe_value(swapped)


@functools.cache
def _tictactoe_value(cells: tuple[int, ...]) -> int:
    """The mover's minimax score of a position that is not over; memoised, so the whole game tree (a few thousand
    positions) is searched once per process."""
    return max(_tictactoe_move_score(cells, action) for action in range(9) if cells[action] == 0)


def tictactoe_perfect(observation: dict[str, np.ndarray], rng: np.random.Generator) -> int:
    """A perfect player: one of the optimal moves, chosen uniformly, so that games against it vary but it never
    loses; the ceiling a trained tictactoe policy is measured against (every game against it a draw)."""
    legal = legal_actions(observation)
    cells = tuple(int(v) for v in read_board(observation).reshape(9))
    scores = np.array([_tictactoe_move_score(cells, int(action)) for action in legal])
    return int(rng.choice(legal[scores == scores.max()]))


@dataclass(frozen=True)
class Tactics:
    """A connect four player's one-move tactics over its games: the positions where it could win at once, and took a
    win; those where it could not but the opponent could win on its next move, and it blocked a column of that win.
    What a one-step lookahead never misses, and what a trained policy's losses to it come from."""

    wins_offered: int = 0
    wins_taken: int = 0
    threats: int = 0
    blocks: int = 0

    def after(self, observation: dict[str, np.ndarray], action: int) -> Tactics:
        """These counts with the move `action` in `observation` (the mover's) added."""
        legal, board = legal_actions(observation), read_board(observation)
        wins = winning_columns(board, OWN, legal)
        if wins:
            return replace(self, wins_offered=self.wins_offered + 1, wins_taken=self.wins_taken + (action in wins))
        threats = winning_columns(board, OPPONENT, legal)
        if threats:
            return replace(self, threats=self.threats + 1, blocks=self.blocks + (action in threats))
        return self

    def __str__(self) -> str:
        return f"wins taken {self.wins_taken} of {self.wins_offered}, threats blocked {self.blocks} of {self.threats}"


@dataclass(frozen=True)
class Record:
    """Games from the first player's point of view. `illegal` counts the actions either player returned that the mask
    did not allow (each replaced by a random legal move so that the game finished); connect four counts the first
    player's `tactics` too (other games leave them at 0)."""

    wins: int
    draws: int
    losses: int
    illegal: int
    tactics: Tactics = field(default_factory=Tactics)

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def win_rate(self) -> float:
        return self.wins / self.games if self.games else 0.0


def make_game_env(game: str) -> Any:
    """The PettingZoo AEC env of `game`; pettingzoo is imported here, not with the module, as it is an optional
    dependency of appo."""
    if game == "connect_four":
        from pettingzoo.classic import connect_four_v3

        return connect_four_v3.env()
    if game == "tictactoe":
        from pettingzoo.classic import tictactoe_v3

        return tictactoe_v3.env()
    raise ValueError(f"unknown game {game!r}; choose from {', '.join(GAMES)}")


def _is_legal(action: Any, mask: np.ndarray) -> bool:
    """Whether `action` is an integer (Python or numpy) that the mask allows."""
    try:
        index = operator.index(action)
    except TypeError:
        return False
    return 0 <= index < len(mask) and bool(mask[index])


def play_games(game: str, first: Player, second: Player, games: int, seed: int) -> Record:
    """Play `games` games of `game` ("connect_four" or "tictactoe"): `first` takes the env's first seat (the one that
    moves first: connect four's player_0, tictactoe's player_1) in even games and the second seat in odd ones, so the
    first-mover advantage favours neither side.
    Game k is reset with seed + k; each player's rng (and that of the moves replacing illegal ones) comes from `seed`,
    so a record is reproducible. An illegal action is counted and replaced by a random legal move. A `StatefulPlayer`
    starts each game anew and watches the opponent's moves (one object must not take both seats: it has one state)."""
    env = make_game_env(game)
    rng_first, rng_second, rng_fallback = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    wins = draws = losses = illegal = 0
    tactics = Tactics()
    try:
        for k in range(games):
            env.reset(seed=seed + k)
            seat_first, seat_second = env.possible_agents[k % 2], env.possible_agents[1 - k % 2]
            players = {seat_first: (first, rng_first), seat_second: (second, rng_second)}
            stateful = {seat: player for seat, (player, _) in players.items() if isinstance(player, StatefulPlayer)}
            for watcher in stateful.values():
                watcher.new_game()
            while not all(env.terminations[agent] or env.truncations[agent] for agent in env.agents):
                agent = env.agent_selection
                for seat, watcher in stateful.items():
                    if seat != agent:
                        waiting = env.observe(seat)
                        watcher.wait({**waiting, "action_mask": np.zeros_like(waiting["action_mask"])})
                observation = env.observe(agent)
                player, rng = players[agent]
                action = player(observation, rng)
                if not _is_legal(action, observation["action_mask"]):
                    illegal += 1
                    action = random_player(observation, rng_fallback)
                if game == "connect_four" and agent == seat_first:
                    tactics = tactics.after(observation, int(action))
                env.step(int(action))
            reward = env.rewards[seat_first]
            wins, draws, losses = wins + (reward > 0), draws + (reward == 0), losses + (reward < 0)
    finally:
        env.close()
    return Record(wins=int(wins), draws=int(draws), losses=int(losses), illegal=illegal, tactics=tactics)


# The scripted players by name, with the games each plays.
SCRIPTED: dict[str, tuple[Player, tuple[str, ...]]] = {
    "random": (random_player, GAMES),
    "lookahead": (connect_four_lookahead, ("connect_four",)),
    "perfect": (tictactoe_perfect, ("tictactoe",)),
}


def player_names(game: str) -> list[str]:
    """The names `scripted_player` takes for `game`."""
    return [name for name, (_, games) in SCRIPTED.items() if game in games]


def scripted_player(name: str, game: str) -> Player:
    """The scripted player named `name` for `game`; ValueError (its message names the valid values) for a name that is
    unknown or does not play `game`."""
    if game not in GAMES:
        raise ValueError(f"unknown game {game!r}; choose from {', '.join(GAMES)}")
    entry = SCRIPTED.get(name)
    if entry is None or game not in entry[1]:
        raise ValueError(f"{name!r} is not a {game} player; choose from {', '.join(player_names(game))}, or an "
                         "experiment dir or checkpoint of a policy trained on it")
    return entry[0]
