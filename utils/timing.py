"""Per-activity wall-time accounting, reported by every worker as time shares."""

from __future__ import annotations

import time
from collections import defaultdict


class _Span:
    """`with timing.time(key):` adds the block's duration to `totals[key]` (a class: a generator-based
    context manager costs 2.5x as much, and this runs on every loop of every worker)."""

    __slots__ = ("totals", "key", "start")

    def __init__(self, totals: dict[str, float], key: str):
        self.totals, self.key = totals, key

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.totals[self.key] += time.perf_counter() - self.start


class Timing:
    """Sums seconds per named activity between two `take()` calls."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.since = time.perf_counter()

    def time(self, key: str) -> _Span:
        return _Span(self.totals, key)

    def add(self, key: str, seconds: float) -> None:
        self.totals[key] += seconds

    def take(self) -> dict[str, float]:
        """Seconds per activity since the last take, and under "elapsed" the length of that period."""
        now = time.perf_counter()
        totals = dict(self.totals)
        totals["elapsed"] = now - self.since
        self.totals.clear()
        self.since = now
        return totals
