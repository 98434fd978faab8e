"""A run survives damaged checkpoints and loses nothing: corrupt ones are moved aside and the newest intact one
is used, NaN weights are never written, --restart=True moves the old experiment aside, and the trainer refuses
CPUs whose memory order its shared counters do not allow."""

import logging
import os
import platform
import struct
import time
import zipfile

import pytest
import torch

from appo import launch, preflight
from appo.config.cfg import ConfigError, parse_args, save_cfg
from appo.learning.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    latest_intact_checkpoint,
    list_checkpoints,
    parse_name,
    save_checkpoint,
)
from appo.utils.logs import log


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@pytest.fixture
def logged():
    """What the 'appo' logger receives, whatever handlers and propagation earlier tests left it with."""
    handler = _Records()
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)
    log.setLevel(level)


def tiny_state(version: int, fill: float = 1.0) -> dict:
    return {"model": {"w": torch.full((256,), fill), "count": torch.tensor(version)}, "version": version}


def write_checkpoints(directory: str, count: int = 3) -> list[str]:
    return [save_checkpoint(directory, tiny_state(v), v, 1000 * v, keep=10) for v in range(1, count + 1)]


def truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def flip_a_data_byte(path: str) -> None:
    """Damage the tensor bytes but not the archive structure: only the CRC can tell."""
    with zipfile.ZipFile(path) as archive:
        entry = next(i for i in archive.infolist() if i.filename.endswith("data/0"))
    with open(path, "r+b") as f:
        f.seek(entry.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        f.seek(entry.header_offset + 30 + name_len + extra_len + 10)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage,reason", [(truncate, "BadZipFile"), (flip_a_data_byte, "bad CRC in")])
def test_corrupt_newest_checkpoint_is_moved_aside_and_the_next_one_used(tmp_path, logged, damage, reason):
    directory = str(tmp_path / "checkpoint_p0")
    first, second, newest = write_checkpoints(directory)
    damage(newest)

    assert latest_intact_checkpoint(directory) == second
    assert list_checkpoints(directory) == [first, second]
    assert os.path.exists(f"{newest}.corrupt")
    warnings = logged.messages(logging.WARNING)
    assert len(warnings) == 1 and newest in warnings[0] and reason in warnings[0], warnings
    # Saving again keeps --keep_checkpoints intact ones; the file moved aside is not counted, nor removed.
    save_checkpoint(directory, tiny_state(3), 3, 3000, keep=2)
    assert len(list_checkpoints(directory)) == 2 and os.path.exists(f"{newest}.corrupt")


def test_every_checkpoint_corrupt_gives_none_and_a_second_damage_keeps_the_first(tmp_path, logged):
    directory = str(tmp_path / "checkpoint_p0")
    paths = write_checkpoints(directory)
    for path in paths:
        truncate(path)
    assert latest_intact_checkpoint(directory) is None
    assert list_checkpoints(directory) == []
    assert len(logged.messages(logging.WARNING)) == 3
    assert latest_intact_checkpoint(str(tmp_path / "no_such_dir")) is None

    again = save_checkpoint(directory, tiny_state(3), 3, 3000, keep=10)  # same name as a damaged one
    assert again == paths[-1]
    flip_a_data_byte(again)
    assert latest_intact_checkpoint(directory) is None
    assert os.path.exists(f"{again}.corrupt") and os.path.exists(f"{again}.corrupt_1")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_never_written(tmp_path, logged, bad):
    directory = str(tmp_path / "checkpoint_p0")
    before = write_checkpoints(directory)
    state = tiny_state(4)
    state["model"]["w"][17] = bad

    assert save_checkpoint(directory, state, 4, 4000, keep=3) is None
    assert list_checkpoints(directory) == before
    assert not [name for name in os.listdir(directory) if not name.endswith(".pth")]  # no .tmp left either
    errors = logged.messages(logging.ERROR)
    assert len(errors) == 1 and "policy checkpoint not written: non-finite values in w" in errors[0], errors


def make_experiment(train_dir: str, *args: str) -> str:
    """An experiment dir as an earlier run left it: cfg.json, log.txt and three checkpoints of policy 0."""
    cfg, _ = parse_args([f"--train_dir={train_dir}", "--experiment=exp", "--env=CartPole-v1", *args])
    exp_dir = os.path.join(train_dir, "exp")
    write_checkpoints(checkpoint_dir(exp_dir, 0))
    save_cfg(cfg, os.path.join(exp_dir, "cfg.json"))
    with open(os.path.join(exp_dir, "log.txt"), "w") as f:
        f.write("earlier run\n")
    return exp_dir


def prepare(train_dir: str, *args: str):
    cfg, given = parse_args([f"--train_dir={train_dir}", "--experiment=exp", "--env=CartPole-v1", *args])
    return launch.prepare(cfg, given)


def test_restart_moves_the_old_experiment_aside(tmp_path, logged, monkeypatch):
    train_dir = str(tmp_path / "train_dir")
    exp_dir = make_experiment(train_dir)
    monkeypatch.setattr(time, "strftime", lambda fmt: "20250102-030405")

    cfg, _, _, initial_env_steps = prepare(train_dir, "--restart=True")
    aside = os.path.join(train_dir, "exp_before_restart_20250102-030405")
    assert sorted(os.listdir(train_dir)) == ["exp", "exp_before_restart_20250102-030405"]
    assert os.listdir(exp_dir) == ["cfg.json"] and initial_env_steps == [0]
    assert len(list_checkpoints(checkpoint_dir(aside, 0))) == 3
    with open(os.path.join(aside, "log.txt")) as f:
        assert f.read() == "earlier run\n"
    assert any(aside in message for message in logged.messages(logging.INFO))

    write_checkpoints(checkpoint_dir(exp_dir, 0), count=1)
    prepare(train_dir, "--restart=True")  # within the same second: a suffix, nothing replaced
    assert len(list_checkpoints(checkpoint_dir(f"{aside}_1", 0))) == 1
    assert len(list_checkpoints(checkpoint_dir(aside, 0))) == 3

    # cfg.json now says restart=True; running again without the flag resumes instead of starting over.
    write_checkpoints(checkpoint_dir(exp_dir, 0), count=2)
    cfg, _, _, initial_env_steps = prepare(train_dir)
    assert not cfg.restart and initial_env_steps == [2000]
    assert len(os.listdir(train_dir)) == 3


def test_resume_with_every_checkpoint_corrupt_starts_from_scratch(tmp_path, logged):
    train_dir = str(tmp_path / "train_dir")
    exp_dir = make_experiment(train_dir, "--num_policies=2")
    write_checkpoints(checkpoint_dir(exp_dir, 1), count=2)
    for path in list_checkpoints(checkpoint_dir(exp_dir, 0)):
        truncate(path)
    truncate(list_checkpoints(checkpoint_dir(exp_dir, 1))[-1])

    _, _, _, initial_env_steps = prepare(train_dir, "--num_policies=2")
    assert initial_env_steps == [0, 1000]
    warnings = logged.messages(logging.WARNING)
    assert len([w for w in warnings if w.startswith("Skipping corrupt checkpoint")]) == 4
    scratch = [w for w in warnings if "from scratch" in w]
    assert len(scratch) == 1 and scratch[0].startswith("Policy 0: every checkpoint"), warnings
    assert len([name for name in os.listdir(checkpoint_dir(exp_dir, 0)) if name.endswith(".corrupt")]) == 3


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "i686", ""])
def test_weakly_ordered_or_unknown_cpu_is_refused_before_anything_is_created(tmp_path, capsys, monkeypatch,
                                                                               machine):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    train_dir = tmp_path / "train_dir"
    assert launch.main([f"--train_dir={train_dir}", "--experiment=exp", "--env=CartPole-v1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"this CPU ({machine or 'unknown'}) is not x86-64" in lines[0], lines
    assert not os.path.exists(train_dir)


@pytest.mark.parametrize("machine", ["x86_64", "AMD64"])
def test_x86_64_is_accepted(monkeypatch, machine):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    preflight.check_platform()
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(ConfigError, match="ARM64"):
        preflight.check_platform()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_run_resumes_from_the_newest_intact_checkpoint(trainer):
    args = ["--env=CartPole-v1", "--experiment=survive", "--num_workers=1", "--num_envs_per_worker=8",
            "--decorrelate_envs_on_one_worker=False"]
    first = trainer.run(*args, "--train_for_env_steps=6000", "--save_every_sec=0.2")
    assert first.returncode == 0, first.stdout + first.stderr
    exp_dir = os.path.join(trainer.train_dir, "survive")
    *_, intact, newest = list_checkpoints(checkpoint_dir(exp_dir, 0))
    truncate(newest)
    os.remove(os.path.join(exp_dir, "done"))
    version, env_steps = parse_name(intact)

    result = trainer.run(*args, f"--train_for_env_steps={env_steps + 4000}")
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(exp_dir, "log.txt")) as f:
        log_file = f.read()
    for output in (result.stderr, log_file):
        assert f"Skipping corrupt checkpoint {newest} (BadZipFile" in output, output
    assert f"resumed from {intact} (version {version}, {env_steps} env steps)" in result.stdout, result.stdout
    assert os.path.exists(f"{newest}.corrupt")
    assert parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))[1] >= env_steps + 4000
