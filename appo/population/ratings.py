"""Who beats whom: win/draw/loss counts for every pair that met, and an Elo rating per policy and snapshot.

Actors report every finished game of a multi-agent env as the names of its players (`matchmaking.acting_name`: p0,
or p0@v300 for a snapshot) and their scores: the env's per-agent `info["true_objective"]` where it reports one
(Doom: frags, so a shaped reward for pickups wins nothing), else the episode return. Within a game, each pair of
players with different names is one match: the higher score wins, equal scores draw. Ratings are updated match by
match with the Elo rule: `expected = 1 / (1 + 10 ** ((R_b - R_a) / 400))`, `R_a += K * (score - expected)` (and the
opposite for b), with K = ELO_K. A name starts at ELO_START; a snapshot starts at the rating its policy has when
the snapshot first plays, since at that moment it is that policy. Games between players of one name (a policy
against its latest self) say nothing about relative strength and are not counted.

The runner keeps one `Ratings` (torch-free), shows it in the status line and tensorboard, logs the final table,
and saves it as `<experiment>/selfplay/ratings.json` so a resumed run goes on from it.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass

ELO_START = 1000.0
ELO_K = 16.0
ELO_PER_LINE = 5  # names per line of the final table, so that it fits the log's 120 columns
OLD_KEYS = {"return_sum": "score_sum", "opponent_return_sum": "opponent_score_sum"}  # ratings.json before scores


def expected_score(rating: float, opponent: float) -> float:
    """Elo's expected score of a player against an opponent (1 win, 0.5 draw, 0 loss)."""
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


def elo_update(rating_a: float, rating_b: float, score_a: float, k: float = ELO_K) -> tuple[float, float]:
    """Both ratings after one match that a scored `score_a` in."""
    delta = k * (score_a - expected_score(rating_a, rating_b))
    return rating_a + delta, rating_b - delta


@dataclass
class PairRecord:
    """Matches of `a` against `b`, from a's side: wins, draws, losses, and the sums of both players' scores."""

    wins: int = 0
    draws: int = 0
    losses: int = 0
    score_sum: float = 0.0
    opponent_score_sum: float = 0.0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    def rates(self) -> tuple[float, float, float]:
        n = max(1, self.games)
        return self.wins / n, self.draws / n, self.losses / n

    def mean_scores(self) -> tuple[float, float]:
        n = max(1, self.games)
        return self.score_sum / n, self.opponent_score_sum / n


class Ratings:
    def __init__(self):
        self.elo: dict[str, float] = {}
        self.pairs: dict[str, dict[str, PairRecord]] = defaultdict(dict)  # pairs[a][b]: from a's side

    def record_game(self, names: list[str], scores: list[float]) -> None:
        """One finished game: every pair of players with different names is a match."""
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                if names[i] != names[j]:
                    self.record_match(names[i], names[j], scores[i], scores[j])

    def record_match(self, a: str, b: str, score_a: float, score_b: float) -> None:
        for name in (a, b):
            if name not in self.elo:
                self.elo[name] = self.elo.get(_policy_of(name), ELO_START)
        result = 1.0 if score_a > score_b else 0.5 if score_a == score_b else 0.0
        self.elo[a], self.elo[b] = elo_update(self.elo[a], self.elo[b], result)
        for name, opponent, mine, theirs, outcome in ((a, b, score_a, score_b, result),
                                                      (b, a, score_b, score_a, 1.0 - result)):
            record = self.pairs[name].setdefault(opponent, PairRecord())
            if outcome == 1.0:
                record.wins += 1
            elif outcome == 0.5:
                record.draws += 1
            else:
                record.losses += 1
            record.score_sum += mine
            record.opponent_score_sum += theirs

    def games_of(self, name: str) -> int:
        """Rated games `name` has played, against anyone."""
        return sum(record.games for record in self.pairs.get(name, {}).values())

    def against(self, name: str, snapshots: bool) -> PairRecord:
        """`name`'s matches summed over its opponents that are snapshots (True) or learning policies (False)."""
        total = PairRecord()
        for opponent, record in self.pairs.get(name, {}).items():
            if ("@" in opponent) == snapshots:
                total.wins += record.wins
                total.draws += record.draws
                total.losses += record.losses
                total.score_sum += record.score_sum
                total.opponent_score_sum += record.opponent_score_sum
        return total

    # ---------------------------------------------------------------- output
    def status_pieces(self, policies: int) -> list[list[str]]:
        """Per learning policy that played, the pieces of its status: its Elo and the pool's range, then its record
        against the pool and against the other policies (a line may wrap between pieces)."""
        per_policy = []
        for p in range(policies):
            name = f"p{p}"
            if name not in self.elo:
                continue
            head = f"{name} Elo {self.elo[name]:.0f}"
            pool = [rating for other, rating in self.elo.items() if other.startswith(f"{name}@")]
            if pool:
                head += f" (snapshots {min(pool):.0f}-{max(pool):.0f})"
            pieces = [head]
            for label, snapshots in (("vs snapshots", True), ("vs policies", False)):
                record = self.against(name, snapshots)
                if record.games:
                    wins, draws, losses = record.rates()
                    pieces.append(f", {label} W/D/L {wins:.0%}/{draws:.0%}/{losses:.0%} of {record.games}")
            per_policy.append(pieces)
        return per_policy or [["no game between different players yet"]]

    def table(self, limit: int = 12) -> list[str]:
        """The final table: Elo of the learning policies and the newest snapshots, and every pair among them."""
        shown = sorted(self.elo, key=_sort_key)
        learning = [name for name in shown if "@" not in name]
        snapshots = [name for name in shown if "@" in name][-limit:]
        shown = learning + snapshots
        entries = [f"{name} {self.elo[name]:.0f}" for name in shown]
        lines = [("Elo: " if i == 0 else "  ") + ", ".join(entries[i:i + ELO_PER_LINE])
                 for i in range(0, len(entries), ELO_PER_LINE)]
        if len(self.elo) > len(shown):
            lines.append(f"  ({len(self.elo) - len(shown)} older snapshots in selfplay/ratings.json)")
        for a in shown:
            for b, record in sorted(self.pairs.get(a, {}).items(), key=lambda item: _sort_key(item[0])):
                if b in shown and _sort_key(a) < _sort_key(b):
                    wins, draws, losses = record.rates()
                    mine, theirs = record.mean_scores()
                    lines.append(f"  {a} vs {b}: {record.games} games, W/D/L {wins:.1%}/{draws:.1%}/{losses:.1%}, "
                                 f"mean scores {mine:.3f} / {theirs:.3f}")
        return lines

    # ---------------------------------------------------------------- saving
    def to_json(self) -> dict:
        return {"elo": self.elo,
                "pairs": {a: {b: vars(record) for b, record in records.items()} for a, records in self.pairs.items()}}

    @classmethod
    def from_json(cls, data: dict) -> Ratings:
        ratings = cls()
        ratings.elo = {name: float(value) for name, value in data.get("elo", {}).items()}
        for a, records in data.get("pairs", {}).items():
            ratings.pairs[a] = {b: PairRecord(**{OLD_KEYS.get(key, key): value for key, value in record.items()})
                                for b, record in records.items()}
        return ratings

    def save(self, exp_dir: str) -> None:
        path = ratings_path(exp_dir)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.tmp", "w") as f:
            json.dump(self.to_json(), f, indent=1)
        os.replace(f"{path}.tmp", path)

    @classmethod
    def load(cls, exp_dir: str) -> Ratings:
        """The saved ratings of a resumed run, or empty ones."""
        path = ratings_path(exp_dir)
        if not os.path.exists(path):
            return cls()
        with open(path) as f:
            return cls.from_json(json.load(f))


def ratings_path(exp_dir: str) -> str:
    return os.path.join(exp_dir, "selfplay", "ratings.json")


def _policy_of(name: str) -> str:
    """p0 for p0@v300 (a snapshot starts at its policy's rating)."""
    return name.split("@")[0]


def _sort_key(name: str) -> tuple[int, int]:
    """p0, p1, ..., then snapshots by policy and version."""
    policy, _, version = name.partition("@v")
    return int(policy[1:]), int(version) if version else -1
