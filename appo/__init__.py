"""APPO: an asynchronous PPO trainer (actor workers, batched inference workers, one learner per policy).

The Python API, for scripts and notebooks:

    from appo import train, load_policy
    result = train(env="CartPole-v1", experiment="cartpole", train_for_env_steps=500_000)
    policy = load_policy(result.exp_dir)
    action = policy.act(obs, deterministic=True)

`train` is appo/launch.py's (the command line, `python -m appo.train`, is appo/train.py), `load_policy`
appo/learning/trained_policy.py's. Both are imported on first use: actor workers import this package and must not
load torch, which `load_policy` needs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_policy", "train"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from appo.launch import train

        return train
    if name == "load_policy":
        from appo.learning.trained_policy import load_policy

        return load_policy
    raise AttributeError(f"module 'appo' has no attribute {name!r}")
