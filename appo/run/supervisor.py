"""Process lifecycle: start the workers, notice the ones that die, replace them, stop them all.

What a worker does is its role's business (actor_worker, inference_worker, learner); the supervisor only
knows how to start each one (its role, appo/run/roles.py, and a callable giving its current arguments, so a
replacement gets, say, a PBT policy's current hyper-parameters) and what each process last said about
itself (ready, a crash traceback, a fatal error). A death is described once, with its cause; the runner
decides what to do with it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from appo.messages import WorkerFailed
from appo.run.roles import Role
from appo.utils.logs import log
from appo.utils.process import EXIT_FATAL, FatalError, LostPeer, die_with_parent
from appo.utils.queues import forget_waiters, release_if_held_by
from appo.utils.resources import mb, memory_limit_bytes, oom_kills, shm_room

RESTART_WINDOW_S = 3600.0  # --max_worker_restarts counts the restarts of one worker within this window
# A worker that dies this soon after its start, twice in a row with the same cause, would die so again: the run
# stops instead of using up --max_worker_restarts (a /dev/shm too small, a disk that is full, a broken install).
EARLY_DEATH_S = 10.0
KILLED_FROM_OUTSIDE = ("killed by SIGKILL", "killed by SIGTERM")  # an OOM kill is named otherwise (signal_cause)


@dataclass
class Worker:
    """One worker as the supervisor knows it: how to start it, and what its process last said or did."""

    name: str
    role: Role
    args: Callable[[], tuple]  # the arguments of the role's `main`, as of now
    inbox: object  # the queue it reads (appo.utils.queues.forget_waiters after its death), or None
    group: str | None = None  # workers that live and die together (a policy's learner ranks)
    process: multiprocessing.Process | None = None
    started: float = 0.0  # time.monotonic() of the last start
    ready: bool = False
    ready_at: float = 0.0  # time.monotonic() of its "ready"
    error: str | None = None  # traceback or fatal message reported since it started
    fatal: bool = False
    lost_peer: bool = False  # its group's collective failed because another member died (a LostPeer)
    killed_because: str | None = None  # set when the runner killed it (a hang)
    restarts: deque[float] = field(default_factory=deque)  # monotonic times, within RESTART_WINDOW_S
    total_restarts: int = 0
    early_death: str | None = None  # the cause of its last death, when that came within EARLY_DEATH_S of its start


@dataclass
class Death:
    """A worker whose process ended, with its cause."""

    worker: Worker
    cause: str
    # A crash before the worker was ready, or a fatal error: a replacement would fail the same way.
    permanent: bool
    lost_peer: bool = False  # it died only because a member of its group did


class Supervisor:
    """Owns the worker processes of one machine (the runner's, or a Ray node's sampler group); writes nothing in
    shared memory itself (a dead worker's role lowers the flags it may have left raised: `Role.after_death`)."""

    REPORT_WAIT_S = 0.05  # the runner's wait for reports in each loop: the workers run meanwhile

    def __init__(self, report_queue, max_restarts: int):
        self.report_queue, self.max_restarts = report_queue, max_restarts
        self.workers: dict[str, Worker] = {}
        # The cgroup's OOM-kill count, read about once a second while no worker is dead: a death that finds it
        # higher was the OOM killer's.
        self.oom_kills_seen, self.oom_checked_at = oom_kills(), time.monotonic()

    def add(self, name: str, role: Role, args: Callable[[], tuple], inbox, group: str | None = None) -> None:
        """Start worker `name` of `role`: its class's `main(*args())` runs in a forked process. The workers of a
        `group` are restarted together when one of them dies."""
        self.workers[name] = Worker(name, role, args, inbox, group)
        self._start(self.workers[name])

    def _start(self, worker: Worker) -> None:
        context = multiprocessing.get_context("fork")
        worker.process = context.Process(
            target=start_component, name=worker.name, daemon=True,
            args=(worker.name, self.report_queue, worker.role, os.getpid(), *worker.args()))
        worker.ready, worker.error, worker.fatal, worker.lost_peer = False, None, False, False
        worker.killed_because = None
        worker.started = time.monotonic()
        worker.process.start()

    def step_workers(self) -> None:
        """Nothing to do: each worker runs in its own process (appo/run/serial.py steps them in this one)."""

    # ---------------------------------------------------------------- what workers report about themselves
    def on_ready(self, name: str) -> None:
        worker = self.workers[name]
        worker.ready, worker.ready_at = True, time.monotonic()

    def on_failed(self, failure: WorkerFailed) -> None:
        worker = self.workers[failure.name]
        worker.error, worker.fatal, worker.lost_peer = failure.cause, failure.fatal, failure.lost_peer

    def all_ready_at(self) -> float | None:
        """When the last worker (of every role) reported ready; None while one has not."""
        if not all(worker.ready for worker in self.workers.values()):
            return None
        return max(worker.ready_at for worker in self.workers.values())

    def not_ready_after(self, role: Role, seconds: float) -> list[str]:
        """Workers of a role that are not ready this long after they (re)started."""
        now = time.monotonic()
        return [w.name for w in self.workers.values() if w.role == role and not w.ready and now - w.started > seconds]

    # ---------------------------------------------------------------- deaths and replacements
    def deaths(self) -> list[Death]:
        """Workers whose process has ended, with the cause (signal, exit code, traceback or fatal message). Those that
        died of their own cause come first: a member whose collective failed because a peer died (a lost peer) is
        listed after it, and is never permanent (the peer's replacement may well start)."""
        found = []
        for worker in self.workers.values():
            code = worker.process.exitcode
            if code is None:
                continue
            if worker.killed_because:
                cause = worker.killed_because
            elif worker.error:
                cause = worker.error.strip().splitlines()[-1] if not worker.fatal else worker.error
            elif code < 0:
                cause = signal_cause(-code, self.oom_kills_seen)
            else:
                cause = f"exited with code {code}"
            permanent = not worker.lost_peer and (
                worker.fatal or code == EXIT_FATAL or (worker.error is not None and not worker.ready))
            found.append(Death(worker, cause, permanent, worker.lost_peer))
        if not found and time.monotonic() - self.oom_checked_at > 1.0:  # the count before the next death
            self.oom_kills_seen, self.oom_checked_at = oom_kills(), time.monotonic()
        return sorted(found, key=lambda death: death.lost_peer)

    def replace_dead(self, queues: list[tuple[str, object]], drain_reports: Callable[[], None]) -> str | None:
        """Replace every worker that died, after undoing what its death may have left half done; returns why the
        run must stop instead (a permanent failure, or too many restarts), else None.

        `queues` names every queue the group's processes use (a dead process may hold a queue's lock, see
        utils/queues.py); `drain_reports` reads the reports sent so far, since a crash report comes just before
        the exit. A group's member that died of its own cause is the one blamed and counted (`deaths` lists it first);
        every member's clean-up runs before any of them restarts, so no replacement reads what a dead member left."""
        if not self.deaths():
            return None
        drain_reports()
        restarted: set[str] = set()
        for death in self.deaths():
            worker = death.worker
            if worker.name in restarted:  # a member of a group restarted already in this pass
                continue
            if death.permanent:
                what = "stopped the run" if worker.fatal else "crashed while starting (a replacement would too)"
                return f"{worker.name} {what}: {death.cause}"
            if not self.may_restart(worker):
                return (f"{worker.name} died more than --max_worker_restarts={self.max_restarts} times within an "
                        f"hour; last cause: {death.cause}")
            # A kill from outside (a user's kill -9, a chaos test) says nothing about the next start.
            early = time.monotonic() - worker.started < EARLY_DEATH_S and death.cause not in KILLED_FROM_OUTSIDE
            if early and death.cause == worker.early_death:
                return (f"{worker.name} died the same way twice within {EARLY_DEATH_S:g} s of its start, a replacement "
                        f"would too: {death.cause}")
            worker.early_death = death.cause if early else None
            members = self._stop_group(worker, drain_reports)
            for member in members:
                for name, queue in queues:
                    if release_if_held_by(queue, member.process.pid):
                        log.warning("%s died holding the lock of the %s; the queue was emptied and unlocked",
                                    member.name, name)
                if member.inbox is not None:
                    forget_waiters(member.inbox)
                member.role.after_death(*member.args())
            for member in members:
                self.restart(member, counted=member is worker)
                restarted.add(member.name)
            group = f" and the rest of its group ({', '.join(m.name for m in members[1:])})" if members[1:] else ""
            log.warning("%s died (%s); replaced it%s (restart %d of this worker, at most %d per hour)", worker.name,
                        death.cause, group, len(worker.restarts), self.max_restarts)
        return None

    def _stop_group(self, worker: Worker, drain_reports: Callable[[], None]) -> list[Worker]:
        """`worker` and the other members of its group, which are killed and waited for (they would wait on the dead
        one in a collective until it timed out) before any of them restarts."""
        others = [w for w in self.workers.values() if worker.group is not None and w.group == worker.group
                  and w is not worker]
        for other in others:
            if other.process.exitcode is None:
                other.killed_because = f"stopped with {worker.name}, its group's member that died"
                os.kill(other.process.pid, signal.SIGKILL)
            other.process.join()
        if others:
            drain_reports()  # what they said before they died is theirs, not their replacements'
        return [worker, *others]

    def may_restart(self, worker: Worker) -> bool:
        """Within --max_worker_restarts restarts of this worker in the last hour."""
        now = time.monotonic()
        while worker.restarts and now - worker.restarts[0] > RESTART_WINDOW_S:
            worker.restarts.popleft()
        return len(worker.restarts) < self.max_restarts

    def restart(self, worker: Worker, counted: bool = True) -> None:
        """Start `worker` again; `counted` toward --max_worker_restarts unless it only follows its group."""
        worker.process.join(timeout=0)
        if counted:
            worker.restarts.append(time.monotonic())
            worker.total_restarts += 1
        self._start(worker)

    def kill(self, name: str, reason: str) -> None:
        """SIGKILL a worker that is stuck (its death is then reported with `reason` as the cause)."""
        worker = self.workers[name]
        worker.killed_because = reason
        if worker.process.is_alive():
            os.kill(worker.process.pid, signal.SIGKILL)

    def restart_counts(self) -> dict[str, int]:
        """Restarts since the run began, per role name."""
        counts: dict[str, int] = {}
        for worker in self.workers.values():
            counts[worker.role.name] = counts.get(worker.role.name, 0) + worker.total_restarts
        return counts

    # ---------------------------------------------------------------- stopping
    def processes(self) -> list[multiprocessing.Process]:
        return [worker.process for worker in self.workers.values()]

    def join_all(self, deadline: float, while_waiting: Callable[[], None]) -> None:
        """Wait for every worker to exit until `deadline` (time.monotonic), then terminate, then kill."""
        for process in self.processes():
            while process.is_alive() and time.monotonic() < deadline:
                while_waiting()
                process.join(timeout=0.05)
        for process in self.processes():
            if process.is_alive():
                log.warning("%s did not stop in time; terminating it", process.name)
                process.terminate()
                process.join(timeout=1.0)
            if process.is_alive():
                process.kill()
                process.join()


def signal_cause(signum: int, oom_kills_before: int | None) -> str:
    """Why a process killed by `signum` died, as far as the kernel tells: the OOM killer (the cgroup counted one more
    OOM kill), shared memory (a SIGBUS is what a write to a full /dev/shm gets), or just the signal."""
    name = signal.Signals(signum).name
    if signum == signal.SIGKILL and oom_kills_before is not None and (oom_kills() or 0) > oom_kills_before:
        return (f"killed by the kernel's OOM killer ({name}); the machine's memory limit is "
                f"{mb(memory_limit_bytes())}")
    if signum == signal.SIGBUS:
        return f"killed by {name}: shared memory exhausted? {shm_room()}"
    return f"killed by {name}"


def start_component(name: str, report_queue, role: Role, parent_pid: int, *args: Any) -> None:
    """Entry point of every forked worker: import its role's class here, so torch loads only where needed; a crash
    is reported to the runner as a `WorkerFailed` (with the traceback; a `LostPeer` in one line, marked as one) and the
    process exits non-zero."""
    die_with_parent(parent_pid, name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        role.load().main(*args)
    except FatalError as exc:
        log.error("%s: %s", name, exc)
        _report_and_exit(report_queue, WorkerFailed(name, str(exc), fatal=True), EXIT_FATAL)
    except LostPeer as exc:
        log.warning("%s: %s", name, exc)
        _report_and_exit(report_queue, WorkerFailed(name, str(exc), fatal=False, lost_peer=True), 1)
    except Exception:
        text = traceback.format_exc()
        log.error("%s crashed:\n%s", name, text)
        _report_and_exit(report_queue, WorkerFailed(name, text, fatal=False), 1)


def _report_and_exit(report_queue, failure: WorkerFailed, code: int) -> None:
    with contextlib.suppress(Exception):
        report_queue.put(failure, timeout=1.0)
    sys.stdout.flush()
    os._exit(code)
