"""Runs one Doom engine so that it never outlives the process that asked for it, and leaves nothing in /dev/shm.

ViZDoom starts its engine (the `vizdoom` binary) as a child process and talks to it through a shared-memory
segment and two message queues in /dev/shm (about 1-11 MB each game, by screen size). When the process that
owns the game dies without `game.close()` (kill -9, a crash, the OOM killer), the engine is orphaned and keeps
running and its segments stay. `envs/doom/game.py` therefore points ViZDoom at a one-line wrapper that execs
this script in front of the real binary:

    vizdoom controller (actor) -> this guard (same pid as the wrapper) -> the real engine

- The guard waits on the controller process and on the engine (pidfds). When the controller exits first, the
  guard kills the engine and removes the engine's /dev/shm entries (their names end in the game's
  `+viz_instance_id`). It watches the process, not the thread that started the game: games start in threads.
- SIGTERM or SIGHUP to the guard kills the engine and removes its entries too.
- The engine gets SIGKILL if the guard itself dies (SIGKILL), and runs in its own process group, so a Ctrl-C in the
  terminal reaches the trainer (which closes its games in order) and not the engines.
- When the engine exits by itself (a normal `game.close()`), the guard exits with its code.

Usage (by the wrapper only): `python -I -S engine_guard.py CONTROLLER_PID REAL_ENGINE [engine args...]`.
Stdlib only, since it starts once per game and `-S` skips site-packages.
"""

from __future__ import annotations

import ctypes
import glob
import os
import select
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
SHM_DIR = "/dev/shm"


def instance_id(engine_args: list[str]) -> str | None:
    """The game's id from the engine's arguments (`+viz_instance_id ID`), which names its /dev/shm entries."""
    for flag, value in zip(engine_args, engine_args[1:]):
        if flag == "+viz_instance_id":
            return value
    return None


def remove_engine_shm(game_id: str | None, shm_dir: str = SHM_DIR) -> int:
    """Remove the /dev/shm entries of one game (ViZDoomSM<id>, ViZDoomMQCtr<id>, ViZDoomMQDoom<id>); how many."""
    if not game_id:
        return 0
    removed = 0
    for path in glob.glob(os.path.join(shm_dir, f"ViZDoom*{game_id}")):
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _start_engine(command: list[str]) -> subprocess.Popen:
    def in_child() -> None:
        os.setpgrp()  # a terminal's Ctrl-C goes to the trainer, which closes its games itself
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # if the guard itself dies

    return subprocess.Popen(command, preexec_fn=in_child)


def main(argv: list[str]) -> int:
    controller_pid, engine = int(argv[0]), argv[1]
    engine_args = argv[2:]
    game_id = instance_id(engine_args)
    engines: list[subprocess.Popen] = []
    stopped_by: list[int] = []

    def stop(signum, _frame) -> None:  # the wait below then sees the engine exit
        stopped_by.append(signum)
        for process in engines:
            process.kill()

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        controller = os.pidfd_open(controller_pid)
    except ProcessLookupError:
        controller = None
    if controller is None or os.getppid() != controller_pid or stopped_by:  # the controller is gone already
        remove_engine_shm(game_id)
        return 1
    process = _start_engine([engine, *engine_args])
    engines.append(process)
    if stopped_by:  # stopped while the engine was starting
        process.kill()
    engine_exit = os.pidfd_open(process.pid)
    ready, _, _ = select.select([controller, engine_exit], [], [])
    if engine_exit in ready:
        code = process.wait()
        if stopped_by or code != 0:  # a killed or crashed engine cannot clean up after itself
            remove_engine_shm(game_id)
        return 128 + stopped_by[0] if stopped_by else code
    process.kill()  # the controller is gone
    process.wait()
    remove_engine_shm(game_id)
    return 128 + signal.SIGKILL


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
