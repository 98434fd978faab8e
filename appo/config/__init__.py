"""Configuration: the flag table, parsing and validation, the defaults chosen from the env, and typed views.

Torch-free: the runner and the actor workers read it.
"""

from appo.config.cfg import ConfigError

__all__ = ["ConfigError"]
