"""Logging to stderr and to the experiment's log file, from every process."""

from __future__ import annotations

import logging
import sys

_FORMAT = "[%(asctime)s][%(processName)s] %(message)s"


def setup_logging(log_path: str | None = None) -> logging.Logger:
    """Configure the 'appo' logger of this process (stream + append-mode file, safe across processes)."""
    logger = logging.getLogger("appo")
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    formatter = logging.Formatter(_FORMAT, datefmt="%H:%M:%S")
    stream = logging.StreamHandler(sys.stdout)
    stream.setFormatter(formatter)
    logger.addHandler(stream)
    if log_path is not None:
        file_handler = logging.FileHandler(log_path, mode="a")
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


log = logging.getLogger("appo")
