"""Turn an `--env` string into a gymnasium env.

Any id `gymnasium.make` accepts works, including `package.module:EnvName-v0`, for which gymnasium
imports `package.module` (which registers the env) before making it. Workers build envs through this
same function, so an env registered by user code is found in every process.
"""

from __future__ import annotations

import gymnasium as gym


class EnvError(Exception):
    """The env id cannot be made; the message names the id and what would be valid."""


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    try:
        # The passive checker costs ~30% of a CartPole step and only warns; workers step millions of times.
        return gym.make(env_id, disable_env_checker=True, render_mode=render_mode)
    except gym.error.Error as exc:
        raise EnvError(f"--env={env_id}: cannot be made by gymnasium ({exc}); use a registered id "
                       "such as CartPole-v1 or 'package.module:EnvName-v0'") from exc
    except ModuleNotFoundError as exc:
        raise EnvError(f"--env={env_id}: module {exc.name!r} not found; install it or fix the module path") from exc


def env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one agent, read from a throw-away env instance."""
    env = make_env(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()
