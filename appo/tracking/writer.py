"""What every destination of the Recorder is: a `Writer`, and the one line that says why one stopped."""

from __future__ import annotations

# FINISHED, FAILED, KILLED: how a run ended, in MLflow's words (W&B takes an exit code, wandb_writer.EXIT_CODES).
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"
LINE_LENGTH = 300  # the most of an error's text a stop line shows: a server's answer can be a page of HTML


def run_status(completed: bool, failed: bool) -> str:
    """How a run ended, as the trackers keep it: a run that reached its budget or target FINISHED, one that failed
    FAILED, one stopped before either (Ctrl-C, SIGTERM) KILLED."""
    if completed:
        return FINISHED
    return FAILED if failed else KILLED


def one_line(error: BaseException) -> str:
    """An exception as one short line: its type and its text with the line breaks taken out."""
    text = " ".join(str(error).split())
    line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return line if len(line) <= LINE_LENGTH else line[:LINE_LENGTH - 3] + "..."


class Writer:
    """One place the Recorder's records go. A subclass overrides what it keeps (JSONL keeps no text, tensorboard no
    files); a call that fails raises, and the Recorder (or, for a tracker, its `Background`) says the first failure
    in one line that starts with `stops` and calls the writer no more."""

    name = "writer"  # what the log lines call it
    stops = "writes stop"  # how its stop line starts

    def scalars(self, policy: int, env_steps: int, wall_time: float, values: dict[str, float]) -> None:
        """One policy's `values` (tag -> value, tags as tensorboard keeps them), all at its `env_steps`."""

    def text(self, policy: int, env_steps: int, tag: str, text: str) -> None:
        """A string under `tag` (the self-play table)."""

    def artifact(self, path: str, folder: str) -> None:
        """A file (a PNG, an mp4), kept under `folder`."""

    def close(self, status: str | None) -> None:
        """The end: `status` is how the run ended (FINISHED, FAILED or KILLED); None leaves a tracker run's status
        as it was (a video sent to a finished run)."""

    def describe(self, error: BaseException) -> str:
        """A failure of this writer in words, for its stop line."""
        return one_line(error)

    @classmethod
    def abort(cls) -> None:
        """Ends what the writer started outside this process when its thread cannot finish by the deadline."""
