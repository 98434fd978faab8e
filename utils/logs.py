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
        file_handler = LogFileHandler(log_path, mode="a")
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


class LogFileHandler(logging.FileHandler):
    """The experiment's log file. A write that fails (a full disk, a read-only filesystem) is said once, in one line
    on stdout, and the file is written no more by this process: logging's default prints a whole traceback for every
    record that fails, which buried the one line that said the disk was full."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        self.close()
        logging.getLogger("appo").removeHandler(self)
        print(f"log file {self.baseFilename}: {error}; the log goes on on stdout only", file=sys.stdout, flush=True)


log = logging.getLogger("appo")
