"""What every role's class is: `WorkerRole`, the interface the actor, inference, learner, evaluator and Ray cluster
classes share, so that the supervisor and --serial_mode run any of them the same way. The table of roles, which
names those classes, is appo/run/roles.py: it sits above the layers whose classes it imports.
"""

from __future__ import annotations

from appo.memory.control import SharedControl


class WorkerRole:
    """What every role's class (actor, inference, learner, evaluator, the Ray cluster process) is: `setup()`, then
    `step(timeout)` until the run stops, then `close()`. A step does one round of the role's work and blocks at
    most `timeout` seconds, so the same object runs in its own process (`run`) or, with --serial_mode, is stepped
    by the runner in the main process (appo/run/serial.py). A step that raises ends the process with the traceback
    (the supervisor reports it); `close()` runs when the run stops. The class's `main(ctx, ...)` is the entry point
    of the role's process."""

    STEP_TIMEOUT_S = 0.05  # how long a step may block in the role's own process
    control: SharedControl

    def run(self) -> None:
        self.setup()
        while not self.control.runner.stop[0]:
            self.step(self.STEP_TIMEOUT_S)
        self.close()

    def setup(self) -> None:
        raise NotImplementedError

    def step(self, timeout: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
