"""APPO: an asynchronous PPO trainer (actor workers, batched inference workers, one learner per policy).

The Python API, for scripts and notebooks:

    from appo import train, load_policy
    result = train(env="CartPole-v1", experiment="cartpole", train_for_env_steps=500_000)
    policy = load_policy(result.exp_dir)
    action = policy.act(obs, deterministic=True)

Both are imported on first use: actor workers import this package and must not load torch. `train` is
also the name of the command-line module `appo.train`; importing that module binds the module to the
package's `train` attribute, so the function is bound over it once it is first asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_policy", "train"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from appo.train import train

        globals()["train"] = train
        return train
    if name == "load_policy":
        from appo.learning.trained_policy import load_policy

        return load_policy
    raise AttributeError(f"module 'appo' has no attribute {name!r}")
