"""Plot a PBT run from its history: each policy's objective and learning rate over its env steps.

Every decision the runner made is a line of `<experiment>/pbt/history.jsonl`; a replacement is drawn as a
marker on the receiving policy's curves, labelled with the donor. Needs matplotlib (`pip install -e ".[bench]"`).

    python scripts/pbt_plot.py train_dir/cartpole_pbt --out docs/pbt_cartpole.png
"""

from __future__ import annotations

import argparse
import json
import os


def load_history(exp_dir: str) -> list[dict]:
    path = os.path.join(exp_dir, "pbt", "history.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"error: {path} does not exist; is {exp_dir} a --with_pbt=True experiment?")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot(history: list[dict], out: str, title: str, shaping_key: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # (key, label, y scale, drawn as steps: hyper-parameters hold their value until the next decision). Shaping
    # coefficients move by factors like the learning rate, but may be 0 or negative (then symlog).
    panels = [("objective", "objective (mean of last episodes)", "linear", False),
              ("learning_rate", "learning rate", "log", True)]
    if shaping_key:
        positive = all(e["shaping_after"].get(shaping_key, 1.0) > 0 for e in history)
        panels.append((shaping_key, f"reward shaping: {shaping_key}", "log" if positive else "symlog", True))
    figure, axes = plt.subplots(len(panels), 1, figsize=(9, 3.2 * len(panels)), sharex=True)
    policies = sorted({event["policy"] for event in history})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for p in policies:
        events = [e for e in history if e["policy"] == p]
        steps = [e["env_steps"] for e in events]
        values = {
            "objective": [e["objectives"][p] for e in events],
            "learning_rate": [e["hyperparams_after"]["learning_rate"] for e in events],
        }
        if shaping_key:
            values[shaping_key] = [e["shaping_after"].get(shaping_key) for e in events]
        color = colors[p % len(colors)]
        for ax, (key, _, _, as_steps) in zip(axes, panels):
            ax.plot(steps, values[key], "-", color=color, label=f"policy {p}", linewidth=1.2,
                    drawstyle="steps-post" if as_steps else "default")
            for e, x, y in zip(events, steps, values[key]):
                if e["kind"] == "replace":
                    ax.plot([x], [y], "x", color=color, markersize=8, markeredgewidth=2)
                    if key == "objective":
                        ax.annotate(f"<-p{e['donor']}", (x, y), fontsize=7, color=color,
                                    xytext=(3, 3), textcoords="offset points")
    for ax, (_, label, scale, _) in zip(axes, panels):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.set_yscale(scale, **({"linthresh": 1e-2} if scale == "symlog" else {}))
    axes[0].set_title(f"{title}  (x: weights replaced, value after the decision; <-pN: donor)")
    axes[0].legend(fontsize=8, loc="best")
    axes[-1].set_xlabel("env steps of the policy")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exp_dir", help="The experiment folder (<train_dir>/<experiment>).")
    parser.add_argument("--out", default=None, help="PNG path (default: <exp_dir>/pbt/pbt.png).")
    parser.add_argument("--shaping", default=None, help="Also plot this reward-shaping coefficient.")
    args = parser.parse_args()
    history = load_history(args.exp_dir)
    if not history:
        raise SystemExit(f"error: {args.exp_dir}: the PBT history is empty (no decision was made yet)")
    out = args.out or os.path.join(args.exp_dir, "pbt", "pbt.png")
    plot(history, out, os.path.basename(os.path.normpath(args.exp_dir)), args.shaping)
    print(f"wrote {out} ({len(history)} decisions, {sum(e['kind'] == 'replace' for e in history)} replacements)")


if __name__ == "__main__":
    main()
