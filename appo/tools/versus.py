"""`python -m appo.versus`: games of a turn-based classic game between two players, trained or scripted.

    python -m appo.versus --game connect_four --first train_dir/connect_four --second lookahead --games 300

A player is an experiment dir or checkpoint file (a trained policy: its most likely legal move, `policy_player`) or a
scripted player of appo.envs.classic_games: random, lookahead (connect four), perfect (tic-tac-toe). The two players
change seats every game; the one line printed is the first player's record (wins, draws, losses, win rate, and the
illegal actions either returned, each replaced by a random legal move).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from appo.config.cfg import ConfigError, OneLineParser
from appo.envs import EnvError
from appo.envs.classic_games import GAMES, Player, make_game_env, play_games, scripted_player
from appo.learning.trained_policy import PolicyLoadError, TrainedPolicy, load_policy
from appo.spaces import obs_spaces
from appo.utils.process import EXIT_BAD_INPUT


class PolicyPlayer:
    """A trained policy as a player (`policy_player`), a `StatefulPlayer`: a recurrent policy starts each game from a
    zero state and steps it on the opponent's moves too, on its own seat's observation, as it did in training."""

    def __init__(self, policy: TrainedPolicy, deterministic: bool):
        self.policy, self.deterministic = policy, deterministic

    def __call__(self, observation: dict[str, np.ndarray], rng: np.random.Generator) -> int:
        return int(self.policy.act(observation, deterministic=self.deterministic))

    def new_game(self) -> None:
        self.policy.reset()

    def wait(self, observation: dict[str, np.ndarray]) -> None:
        if self.policy.model.state_size:  # a feed-forward policy has no state to step
            self.policy.act(observation, deterministic=True)


def policy_player(source: str, game: str, deterministic: bool = True) -> PolicyPlayer:
    """A trained policy as a player: `source` is an experiment dir (its newest checkpoint) or a checkpoint file. It
    sees what it saw in training, the mover's observation with its action mask, and plays its most likely legal move
    (`deterministic`) or samples one. A policy trained on another env is a PolicyLoadError."""
    policy = load_policy(source)
    env = make_game_env(game)
    wanted = shapes(env.observation_space(env.possible_agents[0]))
    env.close()
    if shapes(policy.obs_space) != wanted:
        raise PolicyLoadError(f"{source}: a policy of --env={policy.cfg.env} sees {shapes(policy.obs_space)}, not "
                              f"{game}'s {wanted}")
    return PolicyPlayer(policy, deterministic)


def shapes(space: Any) -> dict[str, tuple[int, ...]]:
    return {key: tuple(part.shape) for key, part in sorted(obs_spaces(space).items())}


def player_by_name(name: str, game: str) -> Player:
    """An experiment dir or checkpoint file (`policy_player`), or a scripted player's name (ValueError, naming the
    valid values, for a name that is neither or does not play `game`)."""
    return policy_player(name, game) if os.path.exists(name) else scripted_player(name, game)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m appo.versus", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=GAMES, required=True)
    parser.add_argument("--first", required=True, help="random, lookahead (connect_four), perfect (tictactoe), or a "
                                                         "trained policy: its experiment dir or a checkpoint file")
    parser.add_argument("--second", required=True, help="as --first")
    parser.add_argument("--games", type=positive_int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    try:
        args = parser.parse_args(argv)
        players = []
        for flag in ("first", "second"):
            try:
                players.append(player_by_name(getattr(args, flag), args.game))
            except ValueError as error:
                raise ConfigError(f"--{flag}: {error}") from error
    except (ConfigError, PolicyLoadError, EnvError) as exc:
        print(f"appo.versus: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    record = play_games(args.game, players[0], players[1], args.games, args.seed)
    print(f"{args.game} {args.first} vs {args.second}, {record.games} games (seed {args.seed}): wins {record.wins}, "
          f"draws {record.draws}, losses {record.losses}, win rate {record.win_rate:.3f}, illegal {record.illegal}"
          + (f"; {args.first}: {record.tactics}" if args.game == "connect_four" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
