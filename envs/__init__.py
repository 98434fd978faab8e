"""Environment creation shared by the runner (to read spaces) and actor workers (to step envs)."""

from envs.registry import EnvError, env_spaces, make_env

__all__ = ["EnvError", "env_spaces", "make_env"]
