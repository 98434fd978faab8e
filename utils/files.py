"""Writing files so that a crash or a full disk never leaves a half-written one in place."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to write the file's content beside it, then rename it over `path` in one step.

    Readers see the old file or the new one, never a part. If `write` raises (a full disk, say), the temporary
    file is removed and `path` is left as it was."""
    tmp = f"{path}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """`atomic_write` for a text file."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    atomic_write(path, write)
