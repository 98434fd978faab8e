"""Score a turn-based game's runs at given training times against scripted players: for each experiment, the checkpoint
saved closest to each time (from the run's start, its cfg.json) plays `--games` games against each opponent
(appo.versus, the seats alternating), and one table row per run and time gives the win rates.

    python -m appo.train --env=pettingzoo.classic.connect_four_v3:env --experiment=c4_s0 --seed=0 \\
        --train_for_seconds=1800 --save_every_sec=60 --keep_checkpoints=40 [flags]
    python scripts/score_checkpoints.py --game connect_four --minutes 10 30 --opponents random lookahead \\
        train_dir/c4_s0 train_dir/c4_s1 train_dir/c4_s2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from appo.config.cfg import ConfigError, OneLineParser
from appo.envs import EnvError
from appo.envs.classic_games import GAMES, play_games
from appo.learning.checkpoint import checkpoint_dir, list_checkpoints, parse_name
from appo.learning.trained_policy import PolicyLoadError
from appo.tools.versus import player_by_name, policy_player, positive_int
from appo.utils.process import EXIT_BAD_INPUT


def saved_checkpoints(exp_dir: str) -> list[tuple[str, float]]:
    """Policy 0's checkpoints of a run and when each was saved, in seconds after the run started (its cfg.json);
    ConfigError for a dir that is no run or kept none."""
    config = os.path.join(exp_dir, "cfg.json")
    if not os.path.isfile(config):
        raise ConfigError(f"{exp_dir}: no cfg.json, so not the experiment dir of a run")
    start = os.path.getmtime(config)
    saved = [(path, os.path.getmtime(path) - start) for path in list_checkpoints(checkpoint_dir(exp_dir, 0))]
    if not saved:
        raise ConfigError(f"{exp_dir}: no checkpoint (run with --keep_checkpoints high enough to keep the early ones)")
    return saved


def minutes_type(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="scripts/score_checkpoints.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="Experiment dirs of the runs.")
    parser.add_argument("--game", choices=GAMES, required=True)
    parser.add_argument("--minutes", type=minutes_type, nargs="+", default=[10.0, 30.0])
    parser.add_argument("--opponents", nargs="+", default=["random"])
    parser.add_argument("--games", type=positive_int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    try:
        args = parser.parse_args(argv)
        checkpoints = {exp_dir: saved_checkpoints(exp_dir) for exp_dir in args.experiments}
        opponents = {}
        for name in args.opponents:
            try:
                opponents[name] = player_by_name(name, args.game)
            except ValueError as error:
                raise ConfigError(f"--opponents: {error}") from error
    except (ConfigError, PolicyLoadError, EnvError) as exc:
        print(f"score_checkpoints.py: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"| run | minutes | checkpoint (version, env steps) | {' | '.join(f'vs {o}' for o in opponents)} | illegal |")
    print(f"| --- | --- | --- | {' | '.join('---' for _ in opponents)} | --- |")
    rates: dict[tuple[float, str], list[float]] = {}
    for minutes in args.minutes:
        for exp_dir in args.experiments:
            path, seconds = min(checkpoints[exp_dir], key=lambda saved: abs(saved[1] - minutes * 60))
            version, env_steps = parse_name(path)
            player = policy_player(path, args.game)
            records = {name: play_games(args.game, player, opponent, args.games, args.seed)
                       for name, opponent in opponents.items()}
            for name, record in records.items():
                rates.setdefault((minutes, name), []).append(record.win_rate)
            cells = " | ".join(f"{r.win_rate:.1%} ({r.wins}/{r.draws}/{r.losses})"
                               + (f"; {r.tactics}" if args.game == "connect_four" else "") for r in records.values())
            illegal = sum(r.illegal for r in records.values())
            print(f"| {os.path.basename(exp_dir.rstrip('/'))} | {seconds / 60:.1f} | v{version}, {env_steps:,} | "
                  f"{cells} | {illegal} |", flush=True)
    for minutes in args.minutes:
        means = " | ".join(f"{statistics.mean(rates[(minutes, name)]):.1%}" for name in opponents)
        print(f"| mean of {len(args.experiments)} | {minutes:g} | | {means} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
