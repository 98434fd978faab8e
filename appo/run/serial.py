"""--serial_mode=True: every worker of the run lives in the main process, and the runner steps each in turn.

For a debugger (a breakpoint in an env or a model stops the whole run at that line) and for tests that drive a
run without processes. `SerialSupervisor` has the supervisor's interface (appo/run/supervisor.py), so the process
graph is built by the same code (appo/run/graph.py); instead of forking it builds each role's object, whose
`step(0.0)` does one round of that role's work without blocking. There are no deaths to replace: an exception
propagates with its traceback and ends the run. The main process imports torch in this mode (it runs inference
and the learner).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any


class SerialSupervisor:
    """Owns the in-process role objects; writes nothing in shared memory itself."""

    def __init__(self, report_queue, max_restarts: int):
        self.report_queue = report_queue
        self.roles: dict[str, Any] = {}
        self.ready_at: dict[str, float] = {}
        self.started = time.monotonic()
        self.workers: dict[str, Any] = {}  # no processes: the hang detection has nothing to kill

    def add(self, name: str, module: str, function: str, args: Callable[[], tuple], cleanup: Callable[[], object],
            inbox, role: str = "") -> None:
        """Build the role object named `role` of `module` with the arguments its process would get."""
        role_class = getattr(importlib.import_module(module), role)
        self.roles[name] = role_class(*args())

    def step_all(self) -> None:
        """One round of every role, in the order they were added (learners, evaluator, inference, actors)."""
        for name, role in self.roles.items():
            if name not in self.ready_at:
                role.setup()
                self.ready_at[name] = time.monotonic()
            role.step(0.0)

    # ---------------------------------------------------------------- the supervisor's interface
    def on_ready(self, name: str) -> None:
        self.ready_at.setdefault(name, time.monotonic())

    def on_failed(self, failure) -> None:
        raise RuntimeError(f"{failure.name} failed in serial mode: {failure.cause}")

    def all_ready_at(self) -> float | None:
        if len(self.ready_at) < len(self.roles):
            return None
        return max(self.ready_at.values())

    def not_ready_after(self, role: str, seconds: float) -> list[str]:
        return []

    def replace_dead(self, queues, drain_reports) -> str | None:
        return None

    def restart_counts(self) -> dict[str, int]:
        return {}

    def processes(self) -> list:
        return []

    def join_all(self, deadline: float, while_waiting: Callable[[], None]) -> None:
        """Let every role finish as it would on the stop flag (learners save their checkpoint)."""
        for role in self.roles.values():
            role.close()
