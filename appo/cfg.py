"""`appo.cfg.ConfigError` kept at its first import path: see appo/config/cfg.py."""

from appo.config.cfg import ConfigError

__all__ = ["ConfigError"]
