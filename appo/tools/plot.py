"""Learning curves from the runs' tensorboard summaries, as a PNG.

    python -m appo.plot train_dir/cartpole_0 train_dir/cartpole_1 train_dir/cartpole_2 --out curves.png

Each RUN_DIR is an experiment dir (its `summaries/<policy>` event files are read with tensorboard's
reader). Runs whose names differ only in a trailing `_<number>` (seeds) form one curve: their mean, with
the range from the lowest to the highest run shaded, over the x range all of them reached. `--x seconds`
puts wall-clock time since each run's first summary on the x axis instead of env steps.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from appo.config.cfg import ConfigError, OneLineParser
from appo.utils.process import EXIT_BAD_INPUT

SEED_SUFFIX = re.compile(r"_\d+$")
X_LABELS = {"env_steps": "env steps (of the policy)", "seconds": "wall-clock time (s)"}


def read_curve(run_dir: str, tag: str, policy: int, x: str) -> tuple[np.ndarray, np.ndarray]:
    """(x values, tag values) of one run, sorted by x."""
    return curve(summaries_reader(run_dir, policy), run_dir, tag, x)


def summaries_reader(run_dir: str, policy: int) -> Any:
    """A tensorboard reader of one policy's summaries, loaded; its `Reload()` reads only what was written since, so
    a sweep follows a running trial with one (appo/sweep/trial.py)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summaries = os.path.join(run_dir, "summaries", str(policy))
    if not os.path.isdir(summaries):
        raise ConfigError(f"{run_dir}: no tensorboard summaries of policy {policy} ({summaries} is missing)")
    accumulator = EventAccumulator(summaries, size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    return accumulator


def curve(accumulator: Any, run_dir: str, tag: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    """(x values, tag values) of a loaded `summaries_reader`, sorted by x."""
    if tag not in accumulator.Tags()["scalars"]:
        raise ConfigError(f"{run_dir}: no scalar {tag!r}; it has {sorted(accumulator.Tags()['scalars'])}")
    events = accumulator.Scalars(tag)
    if x == "seconds":
        xs = np.array([e.wall_time for e in events]) - events[0].wall_time
    else:
        xs = np.array([e.step for e in events], dtype=float)
    order = np.argsort(xs, kind="stable")
    return xs[order], np.array([e.value for e in events])[order]


def group_runs(run_dirs: list[str]) -> dict[str, list[str]]:
    """Runs by name without a trailing `_<seed>`, in the order given."""
    groups: dict[str, list[str]] = defaultdict(list)
    for run_dir in run_dirs:
        groups[SEED_SUFFIX.sub("", os.path.basename(os.path.normpath(run_dir)))].append(run_dir)
    return dict(groups)


def mean_and_range(curves: list[tuple[np.ndarray, np.ndarray]], points: int = 200
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The curves interpolated on a common grid up to the shortest one's end: grid, mean, lowest, highest."""
    start = max(xs[0] for xs, _ in curves)
    end = min(xs[-1] for xs, _ in curves)
    grid = np.linspace(start, end, points) if end > start else np.array([start])
    values = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def draw_mean(ax, curves: list[tuple[Any, Any]], label: str) -> None:
    """The curves' mean as one line, the range between the lowest and the highest shaded when there are several."""
    grid, mean, low, high = mean_and_range(curves)
    (line,) = ax.plot(grid, mean, label=label, marker="o" if len(grid) == 1 else None)  # one point: no line to draw
    if len(curves) > 1:
        ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)


def draw(ax, run_dirs: list[str], x: str = "env_steps", tag: str = "episode/reward", policy: int = 0) -> None:
    """One curve per group of runs (their mean, the range shaded) on a matplotlib axis, with x label and legend."""
    for name, runs in group_runs(run_dirs).items():
        label = f"{name} (mean of {len(runs)} runs)" if len(runs) > 1 else name
        draw_mean(ax, [read_curve(run, tag, policy, x) for run in runs], label)
    ax.set_xlabel(X_LABELS[x])
    ax.grid(alpha=0.3)
    ax.legend()


def plot(run_dirs: list[str], out: str, x: str = "env_steps", tag: str = "episode/reward", policy: int = 0,
         title: str | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    draw(ax, run_dirs, x, tag, policy)
    ax.set_ylabel(f"{tag} (mean over the last --stats_avg episodes)" if tag.startswith("episode/") else tag)
    ax.set_title(title or f"{tag}, policy {policy}")
    fig.tight_layout()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        fig.savefig(out, dpi=100)
    except (OSError, ValueError) as exc:  # ValueError: a format matplotlib does not write (--out=curves.txt)
        raise ConfigError(f"--out={out}: cannot be written ({getattr(exc, 'strerror', None) or exc})") from exc
    finally:
        plt.close(fig)
    return out


def panels(items: list, out: str, draw_panel: Callable[[Any, Any], None], columns: int = 3) -> None:
    """A PNG of one panel per item, `columns` a row (the benchmark scripts' grids of tasks): `draw_panel(ax, item)`
    fills each, the spare places of the last row stay empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(columns, len(items))
    rows = math.ceil(len(items) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for ax, item in zip(axes.flat, items):
        draw_panel(ax, item)
    for ax in list(axes.flat)[len(items):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m appo.plot", description=__doc__, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="Experiment dirs (train_dir/experiment).")
    parser.add_argument("--out", default="curves.png", help="PNG to write.")
    parser.add_argument("--x", default="env_steps", choices=sorted(X_LABELS), help="What the x axis shows.")
    parser.add_argument("--tag", default="episode/reward", help="Tensorboard scalar to draw.")
    parser.add_argument("--policy", type=int, default=0, help="Which policy's summaries to read.")
    parser.add_argument("--title", default=None, help="Plot title (default: the tag and policy).")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        path = plot(args.run_dirs, args.out, args.x, args.tag, args.policy, args.title)
    except ConfigError as exc:
        print(f"appo.plot: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
