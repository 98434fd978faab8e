"""A launcher: your own hooks around the trainer's command line (appo/hooks.py).

    python examples/launcher_with_hooks.py --env=CartPole-v1 --experiment=hooks --train_for_env_steps=200000 \
        --eval_every_env_steps=50000

Takes the same flags as `python -m appo.train`. The hooks print each evaluation and checkpoint, and at the end
how many events of each kind they saw (as one JSON line).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from appo import hooks
from appo.train import main

counts: Counter[str] = Counter()


@hooks.on_episode_end
def count_episode(event: hooks.EpisodeEnd) -> None:
    counts["episodes"] += 1
    counts["episode_steps"] += event.length


@hooks.on_learner_iteration
def count_iteration(event: hooks.LearnerIteration) -> None:
    counts["iterations"] += 1


@hooks.on_checkpoint
def announce_checkpoint(event: hooks.CheckpointSaved) -> None:
    counts["best_checkpoints" if event.best else "checkpoints"] += 1
    print(f"hook: policy {event.policy} checkpoint {event.path} (version {event.version})", flush=True)


@hooks.on_evaluation
def announce_evaluation(event: hooks.Evaluation) -> None:
    counts["evaluations"] += 1
    print(f"hook: policy {event.policy} evaluated at {event.env_steps} env steps: mean return "
          f"{event.results['reward']:.2f} over {event.results['episodes']:.0f} episodes", flush=True)


if __name__ == "__main__":
    code = main()
    print("hook counts: " + json.dumps(counts), flush=True)
    sys.exit(code)
