"""Per-activity wall-time accounting, reported by every worker as time shares."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Timing:
    """Sums seconds per named activity between two `take()` calls."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.since = time.perf_counter()

    @contextmanager
    def time(self, key: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[key] += time.perf_counter() - start

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
