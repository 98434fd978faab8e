"""How numbers are written in the printed text: counts with SI units, durations, lines that fit the log."""

from __future__ import annotations

# Printed lines fit 120 columns with the log prefix "[HH:MM:SS][MainProcess] " (24 characters).
LINE_WIDTH = 96


def si(value: float, trim: bool = False) -> str:
    """A count in at most 5 characters, 3 significant digits: 950, 41.2k, 33.0k, 412k, 1.23M (trim: 33k, 1M)."""
    if abs(value) < 999.5:
        return f"{value:.0f}"
    for unit in "kMGT":
        value /= 1000
        if abs(value) < 999.5 or unit == "T":
            break
    if trim:
        return f"{value:.3g}{unit}"
    decimals = next(d for d in (2, 1, 0) if abs(round(value, d)) < 10 ** (3 - d) or d == 0)
    return f"{value:.{decimals}f}{unit}"


def duration(seconds: float) -> str:
    """Seconds in at most 6 characters: 42s, 3m12s, 2h05m, 3d04h."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def fit(pieces: list[str], indent: str = "", more: str = "    ") -> list[str]:
    """Join pieces (each after the first starts with its separator, e.g. ", lag 0/1.2/3") into lines of at most
    LINE_WIDTH characters: a piece that does not fit starts a new line, indented further, without its separator."""
    lines = [indent + pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + len(piece) <= LINE_WIDTH:
            lines[-1] += piece
        else:
            lines.append(indent + more + piece.lstrip(" ,|"))
    return lines
