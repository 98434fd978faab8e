"""Logging to stderr and to the experiment's log file, from every process."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

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


@contextlib.contextmanager
def logger_restored() -> Iterator[None]:
    """Put the 'appo' logger back as it was (handlers, propagation, level) when the block ends, and close the handlers
    the block added: a run in the caller's process (`appo.train()`) sets the logger up for its terminal and log file
    (`setup_logging`), which would otherwise keep the log file open and hide the caller's records from the root
    logger's handlers (a notebook's, pytest's caplog) after it returned."""
    logger = logging.getLogger("appo")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    try:
        yield
    finally:
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers[:] = handlers
        logger.propagate = propagate
        logger.setLevel(level)


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
