"""Experiment tracking (appo/tracking/): the Recorder and its writers, then real CartPole runs with W&B (offline) and
MLflow (a local store, and a real `mlflow server` on the loopback), each read back with the tracker's own reader and
compared with tensorboard's event files. Nothing leaves this machine: W&B offline or pointed at a closed loopback
port, MLflow on 127.0.0.1, no key, no telemetry."""

import contextlib
import dataclasses
import glob
import json
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict

import numpy as np
import psutil
import pytest

from appo.config.cfg import ConfigError, make_config, parse_config
from appo.config.checks import TRACKERS, wandb_tags
from appo.tracking import KILLED, Recorder, Writer, open_recorder, run_status
from appo.tracking.background import Background
from appo.tracking.local import JsonlWriter, TensorboardWriter
from appo.tracking.recorder import WRITERS
from appo.tracking.wandb_writer import wandb_mode
from tests.conftest import REPO, wait_for

RUN = ["--env=CartPole-v1", "--num_workers=1", "--num_envs_per_worker=4", "--experiment_summaries_interval=0.5",
       "--device=cpu"]
TRAIN_S = 150  # a CartPole run of these budgets takes 15-40 s on 2 busy cores


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """This test's processes reach no host but 127.0.0.1: no W&B key or netrc, W&B's own folders in tmp_path, no
    error reports or telemetry from either library."""
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_MODE", "WANDB_ENTITY", "WANDB_PROJECT",
                 "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    for name, value in {"WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
                        "DO_NOT_TRACK": "true"}.items():
        monkeypatch.setenv(name, value)


# ---------------------------------------------------------------- reading back what was written
def f32(value: float) -> float:
    """As tensorboard keeps a value."""
    return float(np.float32(value))


Curves = dict[str, set[tuple[int, float]]]  # tag -> {(env steps, value)}


def tensorboard_scalars(exp_dir: str, policy: int = 0, session: int | None = None) -> Curves:
    """Every scalar of the policy's event files (one file per session; `session`: only that one), read with
    tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    paths = sorted(glob.glob(os.path.join(exp_dir, "summaries", str(policy), "events.out.tfevents.*")))
    curves: Curves = defaultdict(set)
    for path in paths if session is None else [paths[session]]:
        accumulator = EventAccumulator(path, size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            curves[tag].update((event.step, event.value) for event in accumulator.Scalars(tag))
    return dict(curves)


def jsonl_scalars(exp_dir: str) -> Curves:
    curves: Curves = defaultdict(set)
    with open(os.path.join(exp_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            assert record.pop("policy") == 0 and isinstance(record.pop("wall_time"), float)
            steps = record.pop("env_steps")
            for tag, value in record.items():
                curves[tag].add((steps, f32(value)))
    return dict(curves)


def wandb_sessions(exp_dir: str, run_id: str) -> list[str]:
    """The run folders of one W&B run, one per session, oldest first (their names start with the time)."""
    return sorted(glob.glob(os.path.join(exp_dir, "wandb", f"offline-run-*-{run_id}")))


def wandb_records(run_folder: str) -> list[dict]:
    """The records of a run's transaction log (run-<id>.wandb), read by wandb's own reader (`wandb leet inspect`)."""
    [path] = glob.glob(os.path.join(run_folder, "run-*.wandb"))
    result = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def of_type(records: list[dict], kind: str) -> list[dict]:
    return [record[kind] for record in records if record["type"] == kind]


FILES = ("plots/", "videos/")  # the history keys of files (W&B puts their size among the numbers)


def wandb_scalars(records: list[dict], prefix: str = "") -> Curves:
    """The history rows' scalars, by key without `prefix`, at the row's env steps; W&B's own keys (_step, ...) and
    the files left out."""
    curves: Curves = defaultdict(set)
    for history in of_type(records, "history"):
        item = history["item"]
        steps = item.get(f"{prefix}env_steps")
        for key, value in item.items():
            tag = key[len(prefix):]
            if key.startswith(prefix) and tag != "env_steps" and not tag.startswith(("_", *FILES)):
                curves[tag].add((steps, f32(value)))
    return dict(curves)


def wandb_services(pid: int) -> list[psutil.Process]:
    """W&B service processes started for process `pid` (wandb-core --pid PID)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "wandb-core" and "--pid" in cmdline and cmdline[cmdline.index("--pid") + 1:][:1] \
                == [str(pid)]:
            found.append(proc)
    return found


def train(trainer, *args: str, log_path: str, seconds: float = TRAIN_S) -> tuple[str, int, int]:
    """Run `appo.train` (its output into `log_path`, read as it goes); (output, exit code, pid)."""
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(trainer.command(*RUN, *args), cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT,
                                text=True)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"appo.train ran past {seconds} s:\n{read(log_path)[-3000:]}")
    return read(log_path), proc.returncode, proc.pid


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def enjoy_video(trainer, experiment: str) -> str:
    result = subprocess.run([sys.executable, "-m", "appo.enjoy", f"--train_dir={trainer.train_dir}",
                             f"--experiment={experiment}", "--episodes=1", "--max_frames=300", "--save_video"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "video: " in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout + result.stderr


def saved_run_id(exp_dir: str, tracker: str) -> str:
    with open(os.path.join(exp_dir, "tracking.json")) as f:
        return json.load(f)[tracker]["run_id"]


# ---------------------------------------------------------------- the Recorder and its writers, in this process
class FailingWriter(Writer):
    name, stops = "failing", "failing writes stop"

    def __init__(self) -> None:
        self.calls = 0

    def scalars(self, policy: int, env_steps: int, wall_time: float, values: dict[str, float]) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")


class HangingWriter(Writer):
    """A tracker whose server stopped answering: every call waits until `release` is set."""

    name, stops = "hanging", "hanging tracking stops"
    release = threading.Event()
    aborted = threading.Event()

    def scalars(self, policy: int, env_steps: int, wall_time: float, values: dict[str, float]) -> None:
        self.release.wait(60)

    @classmethod
    def abort(cls) -> None:
        cls.aborted.set()


def test_the_recorder_hands_each_writer_one_batch_per_policy_with_tensorboards_tags(tmp_path):
    recorder = Recorder([TensorboardWriter(str(tmp_path)), JsonlWriter(str(tmp_path))])
    recorder.scalars(0, 100, {"episode/reward": 1.5, "episode_extra/goal rate": 0.25, "perf/fps_10s": float("nan")})
    recorder.scalars(1, 50, {"episode/reward": -1.0})
    recorder.scalars(0, 200, {"episode/reward": 2.5})
    recorder.text(0, 200, "selfplay/table", "p0 vs p1")
    recorder.close(None)
    with open(tmp_path / "metrics.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert [(line["policy"], line["env_steps"]) for line in lines] == [(0, 100), (1, 50), (0, 200)]
    assert lines[0]["episode_extra/goal_rate"] == 0.25 and lines[0]["perf/fps_10s"] is None  # JSON has no NaN
    tensorboard = tensorboard_scalars(str(tmp_path))
    [(steps, fps)] = tensorboard.pop("perf/fps_10s")
    assert steps == 100 and np.isnan(fps)
    assert tensorboard == {"episode/reward": {(100, 1.5), (200, 2.5)}, "episode_extra/goal_rate": {(100, 0.25)}}
    assert tensorboard_scalars(str(tmp_path), policy=1) == {"episode/reward": {(50, -1.0)}}


def appo_messages(caplog, level: int = logging.NOTSET) -> list[str]:
    """What appo logged at `level` or above: the trackers' own libraries log too (wandb's DEBUG and INFO records
    reach caplog), and which of their records arrive depends on what ran before."""
    return [r.getMessage() for r in caplog.records if r.name.partition(".")[0] == "appo" and r.levelno >= level]


def test_a_writer_that_fails_is_one_line_and_the_others_go_on(tmp_path, caplog):
    failing = FailingWriter()
    recorder = Recorder([failing, JsonlWriter(str(tmp_path))])
    with caplog.at_level(logging.ERROR, logger="appo"):
        for step in range(3):
            recorder.scalars(0, step, {"episode/reward": step})
        recorder.close("FINISHED")
    assert failing.calls == 1
    assert appo_messages(caplog) == ["failing writes stop: OSError: [Errno 28] No space left on "
                                                        "device"]
    assert jsonl_scalars(str(tmp_path)) == {"episode/reward": {(0, 0.0), (1, 1.0), (2, 2.0)}}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_tracker_that_hangs_never_holds_the_caller_and_is_given_up_at_the_deadline(caplog):
    HangingWriter.release.clear()
    HangingWriter.aborted.clear()
    tracker = Background(HangingWriter)
    recorder = Recorder([tracker])
    recorder.start()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="appo"):
        for step in range(3000):  # more than the queue holds
            recorder.scalars(0, step, {"episode/reward": 1.0})
        assert time.monotonic() - started < 2.0
        recorder.close(KILLED, seconds=1.0)
    assert time.monotonic() - started < 5.0
    assert HangingWriter.aborted.is_set() and tracker.dropped > 0
    errors = appo_messages(caplog, logging.ERROR)
    assert errors == ["hanging tracking stops: still busy 1 s after the run ended (a slow or unreachable server?); "
                      "what it had not sent is lost"]
    HangingWriter.release.set()
    tracker.thread.join(10)
    assert not tracker.thread.is_alive()


def _child_of_a_tracking_runner(recorder: Recorder) -> None:
    """A worker forked while the trackers run: what it does with its copy of them must neither wait nor reach them."""
    recorder.scalars(0, 1, {"episode/reward": 1.0})
    recorder.close(KILLED, seconds=1.0)
    os._exit(0 if not recorder.tracking and not HangingWriter.aborted.is_set() else 1)


@pytest.mark.timeout(60)
def test_a_worker_forked_while_a_tracker_runs_carries_none_of_it():
    # The tracker's thread holds its queue's lock at the fork (it takes it for each record): in the child no thread
    # ever releases it. The child's copy must not wait on it, nor abort what the parent's tracker started.
    HangingWriter.release.clear()
    HangingWriter.aborted.clear()
    tracker = Background(HangingWriter)
    recorder = Recorder([tracker])
    recorder.start()
    held, fork_done = threading.Event(), threading.Event()

    def hold_the_queue() -> None:
        with tracker.records.mutex:
            held.set()
            fork_done.wait(30)

    holder = threading.Thread(target=hold_the_queue)
    holder.start()
    held.wait(10)
    child = multiprocessing.get_context("fork").Process(target=_child_of_a_tracking_runner, args=(recorder,))
    child.start()  # as the supervisor starts a replacement worker
    fork_done.set()
    holder.join(10)
    child.join(20)
    if child.exitcode is None:
        child.kill()
        child.join(10)
    HangingWriter.release.set()
    recorder.close(KILLED, seconds=5.0)
    assert child.exitcode == 0
    assert recorder.writers == [] and not tracker.thread.is_alive() and not tracker.failed  # the parent's is whole


def test_tracker_flags():
    assert wandb_tags(parse_config(["--env=CartPole-v1", "--wandb_tags=cartpole, seed0"])) == ["cartpole", "seed0"]
    assert wandb_tags(make_config(env="CartPole-v1", wandb_tags=["a b", "c,d"])) == ["a b", "c,d"]
    assert wandb_tags(make_config(env="CartPole-v1")) == []
    with pytest.raises(ConfigError, match="--wandb_tags=.*each tag must be a string of 1 to 64 characters"):
        parse_config(["--env=CartPole-v1", f"--wandb_tags={'x' * 65}"])
    with pytest.raises(ConfigError, match="--wandb_mode: invalid choice"):
        parse_config(["--env=CartPole-v1", "--wandb_mode=sometimes"])
    assert [run_status(True, False), run_status(False, True), run_status(False, False)] == [
        "FINISHED", "FAILED", "KILLED"]


def test_every_tracker_of_the_flags_has_a_writer():
    """The trackers are named once (checks.TRACKERS, torch-free); the recorder only says which class writes each."""
    assert set(WRITERS) == set(TRACKERS)


def test_wandb_mode_auto_is_online_only_with_a_key(offline, monkeypatch, tmp_path):
    assert wandb_mode("auto") == "offline" and wandb_mode("online") == "online"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:1")  # a key for another host does not count
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("auto") is None  # wandb reads WANDB_MODE itself


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_wandb_offline_with_two_policies_prefixes_each_policys_keys(offline, tmp_path):
    cfg = make_config(env="CartPole-v1", num_policies=2, num_workers=2, with_wandb=True, wandb_mode="offline",
                      wandb_group="g", wandb_tags="t1,t2")
    exp_dir = str(tmp_path / "train_dir" / "two")
    os.makedirs(exp_dir)
    recorder = open_recorder(cfg, exp_dir, dataclasses.asdict(cfg))
    recorder.start()
    for policy in (0, 1):
        recorder.scalars(policy, 1000 * (policy + 1), {"episode/reward": 10.0 + policy})
    recorder.text(0, 1000, "selfplay/table", "p0 beats p1")
    recorder.close(KILLED)
    assert wandb_services(os.getpid()) == []
    [session] = wandb_sessions(exp_dir, saved_run_id(exp_dir, "wandb"))
    records = wandb_records(session)
    assert wandb_scalars(records, "p0/") == {"episode/reward": {(1000, 10.0)}}
    assert wandb_scalars(records, "p1/") == {"episode/reward": {(2000, 11.0)}}
    metrics = {(m.get("name") or m.get("glob_name"), m.get("step_metric")) for m in of_type(records, "metric")}
    assert {("p0/env_steps", None), ("p0/*", "p0/env_steps"), ("p1/*", "p1/env_steps")} <= metrics
    [run] = of_type(records, "run")
    assert run["run_group"] == "g" and run["tags"] == ["t1", "t2"] and run["display_name"] == "two"
    assert run["config"]["update"]["num_policies"] == 2
    assert any(s["update"].get("p0/selfplay/table") == "p0 beats p1" for s in of_type(records, "summary"))
    assert of_type(records, "exit")[-1]["exit_code"] == 130  # KILLED


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_wandb_server_that_never_answers_is_given_up_and_its_service_ended(offline, monkeypatch, tmp_path, caplog):
    """W&B online against a closed loopback port: wandb.init waits up to its init_timeout (90 s); at the deadline the
    service process is killed, and the waiting thread ends."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]  # closed once the block ends: nothing answers there
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    cfg = make_config(env="CartPole-v1", with_wandb=True, wandb_mode="online")
    exp_dir = str(tmp_path / "train_dir" / "unreachable")
    os.makedirs(exp_dir)
    recorder = open_recorder(cfg, exp_dir, dataclasses.asdict(cfg))
    tracker = recorder.writers[-1]
    recorder.start()
    wait_for(lambda: wandb_services(os.getpid()), 30, "W&B service process")
    recorder.scalars(0, 100, {"episode/reward": 1.0})
    with caplog.at_level(logging.ERROR, logger="appo"):
        recorder.close("FINISHED", seconds=3.0)
    assert appo_messages(caplog) == [
        "wandb tracking stops: still busy 3 s after the run ended (a slow or unreachable server?); what it had not "
        "sent is lost"]
    tracker.thread.join(15)
    assert not tracker.thread.is_alive()
    wait_for(lambda: not wandb_services(os.getpid()), 10, "end of the W&B service")


# ---------------------------------------------------------------- bad input
BLOCKED_IMPORT = """
import runpy, sys

blocked = sys.argv[1]

class Uninstalled:  # as if the package were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == blocked:
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Uninstalled())
sys.argv = ["appo.train", *sys.argv[2:]]
runpy.run_module("appo.train", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("module", ["wandb", "mlflow"])
def test_a_tracker_that_is_not_installed_is_refused_before_the_experiment_dir(tmp_path, module):
    result = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT, module, "--env=CartPole-v1",
                             f"--train_dir={tmp_path / 'train_dir'}", f"--with_{module}=True",
                             "--train_for_env_steps=1000"],  # were it not refused, a short run
                            cwd=REPO, capture_output=True, text=True, timeout=50)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f'error: --with_{module} needs {module}, which is not installed: pip install -e ".[{module}]"']
    assert not os.path.exists(tmp_path / "train_dir")


# ---------------------------------------------------------------- real runs
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_wandb_offline_run_holds_tensorboards_scalars_and_a_resumed_run_continues_it(trainer, offline, tmp_path):
    exp_dir = os.path.join(trainer.train_dir, "wb")
    flags = ["--experiment=wb", "--with_wandb=True", "--wandb_mode=offline", "--with_jsonl=True",
             "--wandb_tags=cartpole,test"]
    output, code, pid = train(trainer, *flags, "--train_for_env_steps=6000", log_path=str(tmp_path / "first.log"))
    assert code == 0 and "Stopped: reached --train_for_env_steps=6000" in output, output[-3000:]
    assert "stops" not in output, output[-3000:]
    assert wandb_services(pid) == []
    run_id = saved_run_id(exp_dir, "wandb")
    [first] = wandb_sessions(exp_dir, run_id)
    records = wandb_records(first)
    tensorboard = tensorboard_scalars(exp_dir)
    assert "episode/reward" in tensorboard and "perf/fps_10s" in tensorboard
    assert wandb_scalars(records) == tensorboard
    assert jsonl_scalars(exp_dir) == tensorboard
    [run] = of_type(records, "run")
    config = {name: value for name, value in run["config"]["update"].items() if name != "_wandb"}
    assert config == json.loads(read(os.path.join(exp_dir, "cfg.json")))
    assert run["run_id"] == run_id and run["tags"] == ["cartpole", "test"]
    assert {"name": "env_steps", "options": {"defined": True}} in of_type(records, "metric")
    assert any(m.get("glob_name") == "*" and m.get("step_metric") == "env_steps" for m in of_type(records, "metric"))
    assert any(h["item"].get("plots/learning_curve._type") == "image-file" for h in of_type(records, "history"))
    assert of_type(records, "exit")[-1]["exit_code"] == 0

    output, code, pid = train(trainer, *flags, "--train_for_env_steps=12000", log_path=str(tmp_path / "second.log"))
    assert code == 0 and "Stopped: reached --train_for_env_steps=12000" in output, output[-3000:]
    assert saved_run_id(exp_dir, "wandb") == run_id and wandb_services(pid) == []
    first_session, second_session = wandb_sessions(exp_dir, run_id)
    resumed = wandb_scalars(wandb_records(second_session))
    assert resumed == tensorboard_scalars(exp_dir, session=1)
    assert min(steps for steps, _ in resumed["episode/reward"]) >= max(s for s, _ in tensorboard["episode/reward"])
    assert max(steps for steps, _ in resumed["episode/reward"]) >= 12000
    assert jsonl_scalars(exp_dir) == tensorboard_scalars(exp_dir)

    enjoy_video(trainer, "wb")
    videos = wandb_records(wandb_sessions(exp_dir, run_id)[2])
    assert any(key.startswith("videos/policy0_v") and value == "video-file"
               for history in of_type(videos, "history") for key, value in history["item"].items())


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_mlflow_local_store_holds_tensorboards_scalars_and_a_resumed_run_continues_it(trainer, offline, tmp_path):
    from mlflow import MlflowClient

    exp_dir = os.path.join(trainer.train_dir, "ml")
    output, code, _ = train(trainer, "--experiment=ml", "--with_mlflow=True", "--train_for_env_steps=6000",
                            log_path=str(tmp_path / "first.log"))
    assert code == 0 and "Stopped: reached --train_for_env_steps=6000" in output, output[-3000:]
    assert "stops" not in output, output[-3000:]
    client = MlflowClient(f"sqlite:///{trainer.train_dir}/mlflow.db")
    run_id = saved_run_id(exp_dir, "mlflow")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "ml"
    assert client.get_experiment(run.info.experiment_id).name == "train_dir"  # the train dir's folder name
    tensorboard = tensorboard_scalars(exp_dir)

    def history() -> Curves:
        return {tag: {(m.step, f32(m.value)) for m in client.get_metric_history(run_id, tag)} for tag in tensorboard}

    assert history() == tensorboard
    assert run.data.params["env"] == "CartPole-v1" and run.data.params["train_for_env_steps"] == "6000"
    assert json.loads(read(client.download_artifacts(run_id, "cfg.json", str(tmp_path)))) == \
        json.loads(read(os.path.join(exp_dir, "cfg.json")))
    assert [a.path for a in client.list_artifacts(run_id, "plots")] == ["plots/learning_curve.png"]

    output, code, _ = train(trainer, "--experiment=ml", "--train_for_env_steps=12000",
                            log_path=str(tmp_path / "second.log"))  # --with_mlflow comes from the saved cfg.json
    assert code == 0 and "Stopped: reached --train_for_env_steps=12000" in output, output[-3000:]
    assert saved_run_id(exp_dir, "mlflow") == run_id and client.get_run(run_id).info.status == "FINISHED"
    tensorboard = tensorboard_scalars(exp_dir)
    assert history() == tensorboard
    assert max(steps for steps, _ in history()["episode/reward"]) >= 12000
    assert client.get_run(run_id).data.params["train_for_env_steps"] == "6000"  # a param never changes

    enjoy_video(trainer, "ml")
    [video] = client.list_artifacts(run_id, "videos")
    assert video.path.startswith("videos/policy0_v") and video.path.endswith(".mp4") and video.file_size > 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rest(url: str, path: str, **query: str) -> dict | None:
    """GET a path of the MLflow REST API as a dashboard would; None while the server does not answer."""
    try:
        with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(query)}", timeout=10) as answer:
            return json.load(answer)
    except OSError:
        return None


@contextlib.contextmanager
def mlflow_server(folder: str):
    """`mlflow server` on 127.0.0.1 with a SQLite store, in a session of its own that is killed whole at the end."""
    url = f"http://127.0.0.1:{free_port()}"
    with open(os.path.join(folder, "server.log"), "w") as log_file:
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
                                   url.rsplit(":", 1)[1], "--workers", "1", "--backend-store-uri",
                                   f"sqlite:///{folder}/server.db", "--artifacts-destination",
                                   os.path.join(folder, "artifacts")],
                                  stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                  # no job runner: it keeps a folder in /dev/shm that a killed server leaves behind
                                  env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        wait_for(lambda: not [p for p in psutil.process_iter() if _session(p) == server.pid], 10, "end of the server")

    try:
        wait_for(lambda: rest(url, "/api/2.0/mlflow/experiments/search", max_results="1") is not None, 120,
                 "answer from mlflow server")
        yield url, stop
    finally:
        stop()


def _session(proc: psutil.Process) -> int | None:
    try:
        return os.getsid(proc.pid)
    except OSError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_mlflow_server_shows_the_runs_metrics_and_a_server_gone_mid_run_costs_one_line(trainer, offline, tmp_path,
                                                                                        monkeypatch):
    exp_dir = os.path.join(trainer.train_dir, "served")
    with mlflow_server(str(tmp_path)) as (url, stop):
        flags = ["--experiment=served", "--with_mlflow=True", f"--mlflow_tracking_uri={url}",
                 "--mlflow_experiment=served_runs"]
        output, code, _ = train(trainer, *flags, "--train_for_env_steps=6000", log_path=str(tmp_path / "first.log"))
        assert code == 0 and "stops" not in output, output[-3000:]
        run_id = saved_run_id(exp_dir, "mlflow")
        run = rest(url, "/api/2.0/mlflow/runs/get", run_id=run_id)["run"]
        assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == "served"
        tensorboard = tensorboard_scalars(exp_dir)
        for tag in ("episode/reward", "perf/fps_10s", "faults/env_errors"):
            points = rest(url, "/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key=tag)["metrics"]
            assert {(int(m["step"]), f32(m["value"])) for m in points} == tensorboard[tag], tag

        # Resumed with a longer budget; the server is killed once the run is RUNNING again and has sent a summary.
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once instead of retrying for minutes
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        log_path = str(tmp_path / "second.log")
        finished = {}
        runner = threading.Thread(target=lambda: finished.update(
            result=train(trainer, *flags, "--train_for_env_steps=40000", log_path=log_path)))
        runner.start()

        def resumed() -> bool:
            answer = rest(url, "/api/2.0/mlflow/runs/get", run_id=run_id)
            points = rest(url, "/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key="perf/fps_10s")
            return (answer is not None and answer["run"]["info"]["status"] == "RUNNING" and points is not None
                    and max(int(m["step"]) for m in points["metrics"]) > 6000)

        wait_for(resumed, TRAIN_S, "resumed run on the server")
        stop()
        runner.join(TRAIN_S)
    output, code, _ = finished["result"]
    assert code == 0 and "Stopped: reached --train_for_env_steps=40000" in output, output[-3000:]
    stops = [line for line in output.splitlines() if "tracking stops" in line]
    assert len(stops) == 1 and "mlflow tracking stops: " in stops[0], output[-3000:]


def _create_together(url: str, exp_dir: str, barrier) -> None:
    """In a forked child: a run's MLflow writer whose first create_experiment waits for the other child's, so that both
    found no experiment and both create it (two trials of a sweep starting together). Exit code 0: it tracks."""
    from mlflow import MlflowClient

    from appo.tracking.mlflow_writer import MlflowWriter

    create = MlflowClient.create_experiment

    def together(self, *args, **kwargs):
        if not getattr(together, "waited", False):
            together.waited = True
            barrier.wait(60)
        return create(self, *args, **kwargs)

    MlflowClient.create_experiment = together
    cfg = parse_config(["--env=CartPole-v1", "--with_mlflow=True", f"--mlflow_tracking_uri={url}",
                        "--mlflow_experiment=together"])
    try:
        MlflowWriter(cfg, exp_dir, {"seed": 1}).close("FINISHED")
    except Exception as exc:
        print(f"{exp_dir}: {exc}", flush=True)
        os._exit(1)
    os._exit(0)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_runs_that_create_the_same_mlflow_experiment_at_once_both_track(offline, tmp_path):
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    with mlflow_server(str(tmp_path)) as (url, _):
        exp_dirs = [tmp_path / "train" / f"run{i}" for i in range(2)]
        for exp_dir in exp_dirs:
            exp_dir.mkdir(parents=True)
        children = [context.Process(target=_create_together, args=(url, str(exp_dir), barrier)) for exp_dir in exp_dirs]
        for child in children:
            child.start()
        for child in children:
            child.join(90)
        assert [child.exitcode for child in children] == [0, 0]
        experiment = rest(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="together")["experiment"]
        run_ids = [saved_run_id(str(exp_dir), "mlflow") for exp_dir in exp_dirs]
        runs = [rest(url, "/api/2.0/mlflow/runs/get", run_id=run_id)["run"]["info"] for run_id in run_ids]
    assert [(run["run_name"], run["experiment_id"], run["status"]) for run in runs] == [
        (f"run{i}", experiment["experiment_id"], "FINISHED") for i in range(2)]
