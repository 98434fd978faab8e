"""--serial_mode=True: every worker of the run lives in the main process, and the runner steps each in turn.

For a debugger (a breakpoint in an env or a model stops the whole run at that line) and for tests that drive a
run without processes. `SerialSupervisor` has the supervisor's interface (appo/run/supervisor.py), so the process
graph is built by the same code (appo/run/graph.py); instead of forking it builds each worker's object (its role's
class, appo/run/roles.py), whose `step(0.0)` does one round of that role's work without blocking. There are no
deaths to replace: an exception propagates with its traceback and ends the run. The main process imports torch in
this mode (it runs inference and the learner).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from appo.run.roles import Role
from appo.workers.roles import WorkerRole


class SerialSupervisor:
    """Owns the in-process worker objects; writes nothing in shared memory itself."""

    REPORT_WAIT_S = 0.0  # the runner must not sleep on its queue: the workers only move when it steps them

    def __init__(self, report_queue, max_restarts: int):
        import torch

        torch.set_num_threads(1)  # as inference and the learner have in their processes by default
        self.objects: dict[str, WorkerRole] = {}  # worker name -> its role's object
        self.set_up: set[str] = set()
        self.ready_at: dict[str, float] = {}

    def add(self, name: str, role: Role, args: Callable[[], tuple], inbox, group: str | None = None) -> None:
        """Build the worker's object (its role's class) with the arguments its process's `main` would get."""
        self.objects[name] = role.load()(*args())

    def step_workers(self) -> None:
        """One round of every worker, in the order they were added (learners, evaluator, inference, actors); a worker's
        set-up comes first, in its first round."""
        for name, worker in self.objects.items():
            if name not in self.set_up:
                worker.setup()
                self.set_up.add(name)
            worker.step(0.0)

    # ---------------------------------------------------------------- the supervisor's interface
    def on_ready(self, name: str) -> None:
        self.ready_at.setdefault(name, time.monotonic())

    def on_failed(self, failure) -> None:
        raise RuntimeError(f"{failure.name} failed in serial mode: {failure.cause}")

    def all_ready_at(self) -> float | None:
        if len(self.ready_at) < len(self.objects):
            return None
        return max(self.ready_at.values())

    def not_ready_after(self, role: Role, seconds: float) -> list[str]:
        return []

    def replace_dead(self, queues, drain_reports) -> str | None:
        return None

    def restart_counts(self) -> dict[str, int]:
        return {}

    def processes(self) -> list:
        return []

    def join_all(self, deadline: float, while_waiting: Callable[[], None]) -> None:
        """Let every worker finish as it would on the stop flag (learners save their checkpoint)."""
        for name, worker in self.objects.items():
            if name in self.set_up:
                worker.close()
