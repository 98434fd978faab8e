"""Weights & Biases: the summaries, the config and files of a run, in a W&B run of its own (`--with_wandb`).

wandb is imported when a writer is made, in its `Background` thread: a run without --with_wandb never loads it.
wandb.init starts a service process (wandb-core), which `close` ends (finish, then teardown), after a failure too.
"""

from __future__ import annotations

import contextlib
import netrc
import os
import secrets
import string
import sys
from typing import Any
from urllib.parse import urlsplit

import psutil

from appo.config.checks import wandb_tags
from appo.config.flags import Config
from appo.tracking.runs import remember_run, tracker_run
from appo.tracking.writer import FAILED, FINISHED, KILLED, Writer

EXIT_CODES = {FINISHED: 0, FAILED: 1, KILLED: 130, None: 0}  # KILLED: as a shell reports Ctrl-C
DEFAULT_HOST = "https://api.wandb.ai"
RUN_ID_LENGTH = 8


def new_run_id() -> str:
    """A run id as W&B makes them: 8 lower-case letters and digits."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(RUN_ID_LENGTH))


def api_key_configured() -> bool:
    """Whether wandb would find an API key without asking: WANDB_API_KEY, or a netrc entry for the W&B host
    (WANDB_BASE_URL, else api.wandb.ai), which `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):  # no netrc file, or one that cannot be read
        return False


def wandb_mode(mode: str) -> str | None:
    """--wandb_mode as wandb.init takes it. auto: WANDB_MODE when set (None lets wandb read it), else online when an
    API key is configured, else offline (a run folder for `wandb sync`, instead of a prompt for a key)."""
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_MODE"):
        return None
    return "online" if api_key_configured() else "offline"


class WandbWriter(Writer):
    """One W&B run per experiment, under <exp_dir>/wandb/, named after the experiment; its id is kept in
    tracking.json, so a resumed experiment continues it (resume="allow"). Metric keys are tensorboard's tags, prefixed
    "p<policy>/" with several policies; each policy's env steps are the step metric its curves are drawn against.
    `run_config` None: attach to the experiment's run to send a file (appo.enjoy's video), config left as it is."""

    name, stops = "wandb tracking", "wandb tracking stops"

    def __init__(self, cfg: Config, exp_dir: str, run_config: dict[str, Any] | None) -> None:
        import wandb

        self.wandb, self.prefixed = wandb, cfg.num_policies > 1
        run_id = tracker_run(exp_dir, "wandb").get("run_id") or new_run_id()
        remember_run(exp_dir, "wandb", {"run_id": run_id, "project": cfg.wandb_project, "entity": cfg.wandb_user})
        hooks = sys.exit, sys.excepthook
        try:
            self.run = wandb.init(id=run_id, resume="allow", dir=exp_dir, name=os.path.basename(exp_dir),
                                  project=cfg.wandb_project, entity=cfg.wandb_user, group=cfg.wandb_group,
                                  job_type=cfg.wandb_job_type, tags=wandb_tags(cfg) or None, config=run_config,
                                  mode=wandb_mode(cfg.wandb_mode),
                                  settings=wandb.Settings(console="off", silent=True))  # the runner's output alone
        except BaseException:
            wandb.teardown()
            raise
        finally:  # wandb.init hooks them to learn the exit code; close() gives it, and the caller's hooks stay
            sys.exit, sys.excepthook = hooks
        for policy in range(cfg.num_policies):
            step = self.key(policy, "env_steps")
            self.run.define_metric(step)
            self.run.define_metric(self.key(policy, "*"), step_metric=step)

    def key(self, policy: int, tag: str) -> str:
        return f"p{policy}/{tag}" if self.prefixed else tag

    def scalars(self, policy: int, env_steps: int, wall_time: float, values: dict[str, float]) -> None:
        self.run.log({self.key(policy, "env_steps"): env_steps,
                      **{self.key(policy, tag): value for tag, value in values.items()}})

    def text(self, policy: int, env_steps: int, tag: str, text: str) -> None:
        self.run.summary[self.key(policy, tag)] = text  # the latest one, on the run's page

    def artifact(self, path: str, folder: str) -> None:
        """A PNG as an image and an mp4 as a video of the run's media, under folder/<file name>; other files among
        the run's files."""
        name, extension = os.path.splitext(os.path.basename(path))
        if extension == ".png":
            self.run.log({f"{folder}/{name}": self.wandb.Image(path)})
        elif extension == ".mp4":
            self.run.log({f"{folder}/{name}": self.wandb.Video(path, format="mp4")})
        else:
            self.run.save(path, base_path=os.path.dirname(path), policy="now")

    def close(self, status: str | None) -> None:
        try:
            self.run.finish(exit_code=EXIT_CODES[status])
        finally:
            if self.wandb.run is None:  # no run of the caller's own (appo.train() in a script that uses W&B) left
                self.wandb.teardown()  # ends the service process

    @classmethod
    def abort(cls) -> None:
        """The thread is stuck in wandb (an unreachable server: wandb.init waits up to its init_timeout, 90 s): kill
        the service process wandb started for this process, which fails the waiting call at once, then let wandb
        forget it (its exit hook would otherwise wait on the service)."""
        for child in psutil.Process().children():
            try:
                if child.name() == "wandb-core":
                    child.kill()
                    child.wait(5)
            except psutil.Error:  # gone meanwhile
                pass
        import wandb

        with contextlib.suppress(Exception):  # the connection to the killed service is lost, as intended
            wandb.teardown()
