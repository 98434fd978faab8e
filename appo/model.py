"""The extension point for encoders kept at its first import path: see appo/learning/model.py."""

from appo.learning.model import register_encoder

__all__ = ["register_encoder"]
