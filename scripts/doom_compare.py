"""This trainer against Sample Factory 2.1.1 on Doom scenarios, each at its own defaults, at equal wall time.

For every scenario and seed: `python -m appo.train --env=doom_<scenario> --train_for_seconds=S --seed=K` (our
defaults), then SF's own example through `scripts/sample_factory_doom.py` (its venv, its defaults), one after the
other, never at once. Both write the same records (JSON lines): time from launch, env frames (4 a step), FPS,
the mean return over the last 100 episodes, the mean episode length in frames (tics). The report gives, per
scenario and trainer, the median over seeds of: the time and the env frames to the scenario's threshold, the
return at the budget, and the training FPS; and plots return against time and against frames.

Thresholds (`THRESHOLDS`), in each scenario's own units:
- basic: a mean return of 80: the monster shot within the first few steps nearly every episode (101 for the
  kill, -4 a step, -5 a miss: 80 is about five steps with no miss); random play is about -170.
- defend_the_center: 10 kills an episode of the 26 bullets (random play: 1-3).
- health_gathering: surviving 1050 tics an episode, half the 2100-tic timeout (random play: about 300-500).
  Compared in tics, not returns: SF plays its own copy of the scenario, which pays 0.01 a tic and no death
  penalty, where the vizdoom wheel's pays 1 a tic and -100 for dying.

    python scripts/doom_compare.py --scenarios basic defend_the_center health_gathering --seeds 1 --seconds 300 \\
        --out docs/doom_compare
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAME_SKIP = 4
THRESHOLDS = {"basic": ("mean_return", 80.0), "defend_the_center": ("mean_return", 10.0),
              "health_gathering": ("mean_episode_frames", 1050.0)}
STATUS = re.compile(r"\| env steps (\d+) \| FPS 10s/60s/300s ([\d.]+k?)/")
POLICY = re.compile(r"p0: v\d+, reward (-?[\d.]+) length ([\d.]+)")


def number(text: str) -> float:
    return float(text[:-1]) * 1000 if text.endswith("k") else float(text)


def run_ours(scenario: str, seed: int, seconds: float, out, train_dir: str) -> None:
    """Our trainer at its defaults; a record per status line (every --report_interval seconds)."""
    start = time.monotonic()
    command = [sys.executable, "-m", "appo.train", f"--env=doom_{scenario}", f"--train_for_seconds={seconds}",
               f"--seed={seed}", f"--train_dir={train_dir}", f"--experiment=doom_{scenario}_{seed}", "--restart=True"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    frames = fps = None
    for line in process.stdout:
        status, policy = STATUS.search(line), POLICY.search(line)
        if status:
            frames, fps = int(status.group(1)) * FRAME_SKIP, number(status.group(2))
        elif policy and frames is not None:
            record = {"trainer": "appo", "scenario": scenario, "seed": seed,
                      "time_s": round(time.monotonic() - start, 2), "env_frames": frames, "fps": fps,
                      "mean_return": float(policy.group(1)),
                      "mean_episode_frames": float(policy.group(2)) * FRAME_SKIP}
            out.write(json.dumps(record) + "\n")
            out.flush()
    if process.wait() != 0:
        raise RuntimeError(f"appo.train exited with code {process.returncode}")


def run_sample_factory(scenario: str, seed: int, seconds: float, out_path: str, sf_python: str) -> None:
    command = [sys.executable, os.path.join(REPO, "scripts", "sample_factory_doom.py"), "--scenario", scenario,
               "--seconds", str(seconds), "--seed", str(seed), "--sf_python", sf_python, "--out", out_path]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def first_reaching(records: list[dict], key: str, threshold: float) -> dict | None:
    return next((r for r in records if r.get(key) is not None and r[key] >= threshold), None)


def summarise(records: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (scenario, trainer): medians over seeds of time and frames to the threshold, return and episode frames
    at the budget, training FPS; how many seeds reached the threshold."""
    rows = {}
    keys = sorted({(r["scenario"], r["trainer"]) for r in records if r.get("mean_return") is not None})
    for scenario, trainer in keys:
        key, threshold = THRESHOLDS[scenario]
        per_seed = {}
        for r in records:
            if r.get("scenario") == scenario and r.get("trainer") == trainer and r.get("mean_return") is not None:
                per_seed.setdefault(r["seed"], []).append(r)
        reached = [first_reaching(rs, key, threshold) for rs in per_seed.values()]
        hits = [r for r in reached if r is not None]
        finals = [rs[-1] for rs in per_seed.values()]
        fps = [statistics.median(r["fps"] for r in rs if r["fps"]) for rs in per_seed.values()]
        rows[(scenario, trainer)] = {
            "seeds": len(per_seed), "reached": len(hits),
            "time_s": statistics.median(r["time_s"] for r in hits) if hits else None,
            "frames": statistics.median(r["env_frames"] for r in hits) if hits else None,
            "final_return": statistics.median(r["mean_return"] for r in finals),
            "final_episode_frames": statistics.median(r["mean_episode_frames"] for r in finals
                                                      if r["mean_episode_frames"] is not None),
            "fps": statistics.median(fps)}
    return rows


def table(rows: dict[tuple[str, str], dict]) -> str:
    lines = ["| scenario | trainer | threshold | reached (seeds) | time to it | env frames to it | return at budget "
             "| episode frames at budget | training FPS |", "|" + " --- |" * 9]
    for (scenario, trainer), row in rows.items():
        key, threshold = THRESHOLDS[scenario]
        what = f"{'return' if key == 'mean_return' else 'tics'} {threshold:g}"
        time_to = f"{row['time_s']:.0f} s" if row["time_s"] is not None else "-"
        frames_to = f"{row['frames'] / 1e3:.0f}k" if row["frames"] is not None else "-"
        lines.append(f"| {scenario} | {trainer} | {what} | {row['reached']} of {row['seeds']} | {time_to} | "
                     f"{frames_to} | {row['final_return']:.1f} | {row['final_episode_frames']:.0f} | "
                     f"{row['fps']:.0f} |")
    return "\n".join(lines)


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = sorted({r["scenario"] for r in records})
    fig, axes = plt.subplots(2, len(scenarios), figsize=(5 * len(scenarios), 7), squeeze=False)
    for column, scenario in enumerate(scenarios):
        key = THRESHOLDS[scenario][0]
        runs = {}
        for r in records:
            if r["scenario"] == scenario and r.get(key) is not None and "time_s" in r:
                runs.setdefault((r["trainer"], r["seed"]), []).append(r)
        for (trainer, seed), rs in sorted(runs.items()):
            style = "-" if trainer == "appo" else "--"
            color = "C0" if trainer == "appo" else "C1"
            label = trainer if seed == min(s for t, s in runs if t == trainer) else None
            axes[0][column].plot([r["time_s"] for r in rs], [r[key] for r in rs], style, color=color, label=label)
            axes[1][column].plot([r["env_frames"] / 1e6 for r in rs], [r[key] for r in rs], style, color=color)
        for row, xlabel in ((0, "seconds from launch"), (1, "env frames (millions)")):
            axes[row][column].axhline(THRESHOLDS[scenario][1], color="grey", lw=0.8)
            axes[row][column].set_xlabel(xlabel)
            axes[row][column].set_ylabel("tics survived" if key == "mean_episode_frames" else "mean return")
        axes[0][column].set_title(f"doom_{scenario}")
        axes[0][column].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", default=list(THRESHOLDS), choices=list(THRESHOLDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--trainers", nargs="+", default=["appo", "sample_factory"],
                        choices=["appo", "sample_factory"])
    parser.add_argument("--sf_python", default="/work/sfvenv/bin/python")
    parser.add_argument("--train_dir", default="/tmp/doom_compare")
    parser.add_argument("--out", default="docs/doom_compare", help="Appends to OUT.jsonl; writes OUT.md, OUT.png.")
    parser.add_argument("--report", action="store_true", help="Only write the report from OUT.jsonl.")
    args = parser.parse_args()
    records_path = f"{args.out}.jsonl"
    if not args.report:
        for scenario in args.scenarios:
            for seed in args.seeds:
                for trainer in args.trainers:
                    print(f"{scenario} seed {seed}: {trainer}", flush=True)
                    if trainer == "appo":
                        with open(records_path, "a") as out:
                            run_ours(scenario, seed, args.seconds, out, args.train_dir)
                    else:
                        part = os.path.join(args.train_dir, f"sf_{scenario}_{seed}.jsonl")
                        os.makedirs(args.train_dir, exist_ok=True)
                        run_sample_factory(scenario, seed, args.seconds, part, args.sf_python)
                        with open(records_path, "a") as out:
                            out.writelines(json.dumps(r) + "\n" for r in load(part))
    records = load(records_path)
    report = table(summarise(records))
    with open(f"{args.out}.md", "w") as f:
        f.write(report + "\n")
    print(report)
    plot(records, f"{args.out}.png")


if __name__ == "__main__":
    main()
