"""Set-up every worker process does first (signals, niceness, threads, parent death), and the exit codes.

How a crash becomes a report is the supervisor's part (appo/run/supervisor.py): a crash exits with code 1 and the
runner replaces the worker; a `FatalError` exits with EXIT_FATAL and stops the run, since a replacement would meet
the same condition; a `LostPeer` is a crash that another process caused (its group restarts, the other is blamed).
"""

from __future__ import annotations

import os
import signal
import sys

from appo.utils.logs import log

EXIT_BAD_INPUT = 2  # a command-line program refused its flags or files (one line on stderr says why)
EXIT_FATAL = 3  # a worker hit a condition a restart would meet again


class FatalError(Exception):
    """A condition a restarted worker would meet again (for example a policy whose updates keep diverging)."""


class LostPeer(Exception):
    """A collective of a learner group failed because another member died or hangs (gloo's "Connection closed by
    peer", a timeout): the supervisor blames the member that died, not this one, and restarts the group."""


def init_worker(cfg, cpu: int | None, single_thread: bool, extra_niceness: int = 0,
                batch_scheduling: bool = False) -> None:
    """Ctrl-C is handled by the runner alone; workers stop when it tells them to.

    `batch_scheduling` puts the process under Linux SCHED_BATCH: it still gets its fair share of CPU, but
    its wake-ups do not preempt whatever runs. Actors wake thousands of times a second; without it each
    wake-up may cut into the inference worker's batch, which every actor then waits for."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cfg.default_niceness + extra_niceness:
        os.nice(cfg.default_niceness + extra_niceness)
    if batch_scheduling and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError as exc:
            log.warning("SCHED_BATCH refused (%s); the process keeps the default scheduling policy", exc)
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        available = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {available[cpu % len(available)]})
    if single_thread:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)


def die_with_parent(parent_pid: int, name: str) -> None:
    """Ask Linux to SIGKILL this process when the process that forked it dies (kill -9, the OOM killer), so no
    worker outlives a runner that can no longer stop it; and name the process after its role (what `ps -o comm`,
    `top` and psutil's name() show). Elsewhere this does nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    signal_on_parent_death(parent_pid, signal.SIGKILL)
    pr_set_name = 15
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_name, ctypes.c_char_p(name.encode()[:15]))


def signal_on_parent_death(parent_pid: int, signum: int) -> None:
    """Ask Linux to send this process `signum` when the thread that started it ends (PR_SET_PDEATHSIG; the request
    survives an exec, so a `preexec_fn` may make it for the program it starts), and exit at once if the parent is
    gone already. SIGTERM lets a trainer stop its workers and free its shared memory (appo/sweep/); SIGKILL is for
    workers, which have nothing of their own to clean. Elsewhere than on Linux this does nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signum)
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os._exit(1)
