"""`python -m appo.train --env=CartPole-v1 --experiment=NAME`: train, or resume, an experiment.

Everything that can be wrong with the input (flags, env id, saved cfg.json, checkpoints) is checked
before the experiment dir is touched; each problem ends the program with one line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from appo.buffers import Layout
from appo.cfg import (
    ConfigError,
    env_kwargs,
    experiment_dir,
    load_saved_cfg,
    merge_resumed,
    parse_args,
    resolve,
    save_cfg,
)
from appo.checkpoint import checkpoint_dir, latest_checkpoint, parse_name, verify_checkpoint
from appo.pbt import load_population
from envs import EnvError, EnvInfo, env_info
from utils.logs import log, setup_logging

EXIT_BAD_INPUT = 2


def prepare(cfg: argparse.Namespace, given: set[str]
            ) -> tuple[argparse.Namespace, EnvInfo, list[str], list[int]] | None:
    """Validate everything, then (re)create the experiment dir. None means: already finished."""
    exp_dir = experiment_dir(cfg)
    notes: list[str] = []
    resuming = not cfg.restart and os.path.exists(os.path.join(exp_dir, "cfg.json"))
    initial_env_steps = [0] * cfg.num_policies  # --num_policies cannot change on resume
    if resuming:
        cfg, notes = merge_resumed(cfg, given, load_saved_cfg(os.path.join(exp_dir, "cfg.json")))
        for p in range(cfg.num_policies):
            latest = latest_checkpoint(checkpoint_dir(exp_dir, p))
            if latest is not None:
                verify_checkpoint(latest)
                initial_env_steps[p] = parse_name(latest)[1]
        if cfg.with_pbt:
            try:
                load_population(exp_dir, cfg.num_policies)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        if os.path.exists(os.path.join(exp_dir, "done")):
            return None
    info = env_info(cfg.env, env_kwargs(cfg))
    cfg = resolve(cfg, info.num_agents)
    try:
        Layout.from_cfg(cfg, info.obs_space, info.action_space, info.num_agents)
    except TypeError as exc:
        raise ConfigError(f"--env={cfg.env}: {exc}") from exc

    check_train_dir(cfg.train_dir)
    check_device(cfg.device)
    if cfg.restart and os.path.exists(exp_dir):
        shutil.rmtree(exp_dir)
    os.makedirs(exp_dir, exist_ok=True)
    save_cfg(cfg, os.path.join(exp_dir, "cfg.json"))
    return cfg, info, notes, initial_env_steps


def check_train_dir(train_dir: str) -> None:
    """The experiment folder can be created: --train_dir is a folder, or can be made. Probed by making and
    removing an empty folder in the nearest existing one: permission bits do not tell (root passes them, yet
    cannot write to a read-only mount or to /proc)."""
    if os.path.exists(train_dir) and not os.path.isdir(train_dir):
        raise ConfigError(f"--train_dir={train_dir}: exists and is not a folder; give a folder")
    existing = os.path.abspath(train_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".appo_probe_", dir=existing))
    except OSError as exc:
        raise ConfigError(f"--train_dir={train_dir}: {existing} is not a writable folder ({exc.strerror}); "
                          "give one that is") from exc


def check_device(device: str) -> None:
    """An explicit CUDA device exists. Asked in a child process: CUDA is never initialised in the runner,
    which forks the workers (a forked child cannot use a CUDA context its parent made)."""
    if not device.startswith("cuda"):
        return
    index = int(device.split(":")[1]) if ":" in device else 0
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True)
    count = int(probe.stdout.strip() or 0)
    if index >= count:
        raise ConfigError(f"--device={device}: this machine has {count} CUDA device(s) visible to torch; use "
                          f"{'--device=cuda:0 to cuda:' + str(count - 1) + ', ' if count else ''}--device=cpu or auto")


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, given = parse_args(argv)
        prepared = prepare(cfg, given)
    except (ConfigError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    exp_dir = experiment_dir(cfg)
    if prepared is None:
        print(f"Experiment {exp_dir} is already finished (delete {os.path.join(exp_dir, 'done')} to train it "
              "further, or pass --restart=True to start over)")
        return 0
    cfg, info, notes, initial_env_steps = prepared
    setup_logging(os.path.join(exp_dir, "log.txt"))
    for note in notes:
        log.info("Resume override: %s", note)

    from appo.runner import Runner

    outcome = Runner(cfg, info, exp_dir, initial_env_steps).run()
    if outcome.completed:
        with open(os.path.join(exp_dir, "done"), "w") as f:
            f.write(outcome.reason + "\n")
    return 1 if outcome.failed else 0


if __name__ == "__main__":
    sys.exit(main())
