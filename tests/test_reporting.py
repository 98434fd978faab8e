"""The status and summary the runner prints: what they show, and that every line fits 120 columns with the log
prefix "[HH:MM:SS][MainProcess] " (24 characters), so 96 for the message. No processes: a Reports is filled by hand."""

import importlib.util
import os
import re
import sys
import time
from collections import deque
from types import SimpleNamespace

import pytest

from appo.config.cfg import build_parser, resolve
from appo.run.reporting import LINE_WIDTH, Reports
from tests.conftest import REPO, last_mean_reward

PREFIX = "[10:00:00][MainProcess] "


def make_reports(tmp_path, *flags: str, policies: int = 2) -> Reports:
    cfg = resolve(build_parser().parse_args(["--env=CartPole-v1", f"--num_policies={policies}", *flags]))
    return Reports(cfg, str(tmp_path), [0] * policies)


def fill(reports: Reports, rewards: list[float], length: float = 123.4) -> None:
    """A full --stats_avg window of episodes per policy, versions, lag and an objective."""
    for p, reward in enumerate(rewards):
        for _ in range(reports.cfg.stats_avg):
            reports.episodes[p].append((reward, length))
            reports.objectives[p].append(0.5 + p / 10)
        reports.episodes_total[p] = 1_234_567
        reports.versions[p] = 123_456
        reports.learner_stats[p].update(lag_min=0, lag_avg=1.2, lag_max=3)


def set_step_rate(reports: Reports, env_steps: list[int], per_second: float) -> None:
    """The learners' env steps now, reached at per_second over the last 50 s."""
    reports.env_steps = list(env_steps)
    now = time.monotonic()
    reports.env_step_history = deque([(now - 50, sum(env_steps) - 50 * per_second), (now, sum(env_steps))])


def assert_fits(text: str, except_paths: bool = False) -> None:
    for line in text.splitlines():
        if except_paths and " checkpoint: " in line:
            continue  # a checkpoint path is printed whole, however long
        assert len(line) <= LINE_WIDTH and len(PREFIX + line) <= 120, line


def module(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "scripts", f"{name}.py"))
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # a dataclass looks its module up there
    spec.loader.exec_module(loaded)
    return loaded


@pytest.mark.parametrize("policies", [2, 4])
def test_every_line_fits_with_faults_pbt_and_large_numbers(tmp_path, policies):
    reports = make_reports(tmp_path, "--with_pbt=True", "--train_for_env_steps=9000000000", policies=policies)
    fill(reports, [-12345.67] * policies, length=12345.6)
    set_step_rate(reports, [2_345_678_901] * policies, 123_456)
    reports.env_errors, reports.nonfinite_values = 123_456, 7_890
    reports.skipped_updates = [3] * policies
    reports.restarts = {"actor": 12, "inference": 3, "learner": 2}
    reports.hyperparams = [{"learning_rate": 1e-3}] * policies
    status = reports.status_line()
    assert_fits(status)
    lines = status.splitlines()
    assert f"env steps {2_345_678_901 * policies} " in lines[0] and "FPS 10s/60s/300s " in lines[0]
    for p in range(policies):
        assert re.search(rf"^  p{p}: v123456, reward -12345.67 length 12345.6 \(100 of 1234567 episodes\), "
                         rf"objective 0.{5 + p}00", status, re.M), status
    assert "  faults: env errors 123456 (episodes lost, envs rebuilt), non-finite values 7890 (set to 0)" in status
    assert "updates skipped (non-finite) " in status and "restarts: actor 12, inference 3, learner 2" in status
    assert re.search(r"^  PBT objective best 0\.\d+ \(p\d\) worst 0.500 \(p0\)", status, re.M), status
    assert len(lines) > policies + 3, "the long faults line wraps onto a second line"
    assert last_mean_reward(PREFIX + f"\n{PREFIX}".join(lines), policy=policies - 1) == -12345.67

    long_path = "train_dir/" + "x" * 80 + "/checkpoint_p0/checkpoint_000123456_2345678901.pth"
    summary = reports.summary_line([long_path] + [None] * (policies - 1))
    assert_fits(summary, except_paths=True)
    lines = summary.splitlines()
    assert re.fullmatch(r"Summary: \d+\.\d s, \d+ env steps", lines[0])
    assert lines[1] == "  p0: final reward -12345.67 (best -12345.67) over 100 episodes"
    assert lines[2] == f"  p0 checkpoint: {long_path}" and lines[-1] == f"  p{policies - 1} checkpoint: none"


def test_no_faults_line_without_faults_and_no_reward_before_the_first_episode(tmp_path):
    reports = make_reports(tmp_path)
    status = reports.status_line()
    assert_fits(status)
    assert "faults" not in status and "restarts" not in status and "PBT" not in status and "reward" not in status
    assert status.splitlines()[0].startswith("no budget, 0s elapsed, ETA - | env steps 0 |")  # the default 1e10 steps
    assert "  p1: v0, no finished episode yet, 0 samples/s" in status
    assert reports.summary_line([None, None]).splitlines()[1:] == [
        "  p0: no finished episode", "  p0 checkpoint: none", "  p1: no finished episode", "  p1 checkpoint: none"]


def test_progress_of_a_step_budget_uses_the_recent_env_step_rate(tmp_path):
    reports = make_reports(tmp_path, "--train_for_env_steps=1000000")
    set_step_rate(reports, [100_000, 300_000], 5000)  # 600k steps left at 5k steps/s: 2 minutes
    fraction, budget, eta = reports.progress()
    assert fraction == pytest.approx(0.4) and budget == "1M steps" and eta == pytest.approx(120, rel=0.01)
    assert reports.status_line().startswith("40.0% of 1M steps in 0s, ETA 2m00s | env steps 400000 | FPS ")
    set_step_rate(reports, [100_000, 300_000], 0)  # no progress measured yet: ETA unknown
    assert "40.0% of 1M steps in 0s, ETA - |" in reports.status_line()
    set_step_rate(reports, [1_000_000, 200_000], 5000)  # past the budget
    assert reports.status_line().startswith("100.0% of 1M steps in 0s, ETA 0s |")


def test_an_absurd_eta_is_not_shown(tmp_path):
    reports = make_reports(tmp_path, "--train_for_env_steps=9000000000")
    set_step_rate(reports, [1000, 1000], 10)  # 900 million seconds
    assert "0.0% of 9G steps in 0s, ETA - |" in reports.status_line()


def test_progress_of_a_time_budget_counts_this_session(tmp_path):
    reports = make_reports(tmp_path, "--train_for_seconds=600", "--train_for_env_steps=1000000")
    reports.start = time.monotonic() - 150.2
    set_step_rate(reports, [50_000, 50_000], 1000)  # 10% of the step budget: the time budget is closer to done
    fraction, budget, eta = reports.progress()
    assert fraction == pytest.approx(0.25, abs=0.01) and budget == "10m00s" and eta == pytest.approx(450, abs=2)
    assert reports.status_line().startswith("25.0% of 10m00s in 2m30s, ETA 7m30s | env steps 100000 |")
    set_step_rate(reports, [200_000, 200_000], 1000)  # 40% of the steps: now the step budget is closer
    assert reports.status_line().startswith("40.0% of 1M steps in 2m30s, ETA 10m00s |")


def test_progress_of_a_benchmark_counts_the_measured_steps(tmp_path):
    reports = make_reports(tmp_path, "--benchmark=True", "--sampler_only=True", policies=1)
    assert reports.progress()[0] == 0.0  # before every actor samples, nothing is measured
    now = time.monotonic()
    reports.measure_start = (now - 10, 100_000, 0)
    reports.sampled_env_steps = 600_000
    reports.frame_history = deque([(now - 10, 100_000), (now, 600_000)])  # 50k env steps/s
    assert reports.status_line().startswith("25.0% of 2M benchmark steps in 0s, ETA 30s | env steps 0 | FPS ")


def test_the_best_reward_is_the_best_full_window_mean_seen(tmp_path):
    reports = make_reports(tmp_path, "--stats_avg=10", policies=1)
    for reward in [5.0] * 9:
        reports.episodes[0].append((reward, 10.0))
        reports.episodes_total[0] += 1
    reports.tick()
    assert reports.best_rewards == [None]  # not a full window yet
    for reward in [5.0, 50.0, 50.0]:
        reports.episodes[0].append((reward, 10.0))
        reports.episodes_total[0] += 1
        reports.tick()
    for _ in range(10):
        reports.episodes[0].append((1.0, 10.0))
        reports.episodes_total[0] += 1
    summary = reports.summary_line(["train_dir/x/checkpoint_p0/checkpoint_000000001_100.pth"])
    assert "  p0: final reward 1.00 (best 14.00) over 10 episodes" in summary.splitlines()


def test_the_scripts_read_the_status(tmp_path):
    reports = make_reports(tmp_path, "--with_pbt=True", "--train_for_env_steps=1000000", policies=3)
    fill(reports, [10.0, 20.0, 30.0])
    set_step_rate(reports, [100_000, 100_000, 100_000], 3000)
    log = [PREFIX + line for line in reports.status_line().splitlines()]
    log += [PREFIX + "Stopped: reached --train_for_env_steps=1000000"]
    log += [PREFIX + line for line in reports.summary_line([None] * 3).splitlines()]
    output = "\n".join(log) + "\n"
    assert module("pbt_experiment").final_stats(output) == {
        0: {"reward": 10.0, "objective": 0.5}, 1: {"reward": 20.0, "objective": 0.6},
        2: {"reward": 30.0, "objective": 0.7}}

    watched_run = module("watched_run")
    watched = watched_run.WatchedRun.__new__(watched_run.WatchedRun)
    watched.launched, watched.lines, watched.samples = time.monotonic(), [], []
    watched.process = SimpleNamespace(stdout=iter(output.splitlines(keepends=True) * 2))
    watched._read()
    assert [(s.env_steps, s.reward) for s in watched.samples] == [(300_000, 10.0)] * 2


def test_ratings_line_and_final_table_fit(tmp_path):
    from appo.population.ratings import Ratings

    reports = make_reports(tmp_path, policies=4)
    fill(reports, [1.0] * 4)
    ratings = Ratings()
    for p in range(4):
        for version in range(100_000, 100_000 + 20_000, 1_000):
            ratings.record_game([f"p{p}", f"p{p}@v{version}"], [1.0, -1.0])
            ratings.record_game([f"p{p}", f"p{(p + 1) % 4}"], [0.0, 0.0])
    reports.ratings = ratings
    status = reports.status_line()
    assert_fits(status)
    for p in range(4):
        assert re.search(rf"^  ratings: p{p} Elo \d+ \(snapshots \d+-\d+\), vs snapshots W/D/L 100%/0%/0% of 20\n"
                         r"      vs policies W/D/L 0%/100%/0% of 40$", status, re.M), status
    assert_fits("\n".join(ratings.table()))


def test_cluster_line_fits_counts_node_restarts_and_the_network_can_be_the_bottleneck(tmp_path):
    """--backend=ray: the cluster process's report gives per-group FPS and bytes/s, node worker restarts and
    replaced groups join the faults, and a busy cluster process names the network in the benchmark."""
    reports = make_reports(tmp_path, "--backend=ray", "--num_workers=4", policies=1)
    reports.restarts = {"learner": 1}
    reports.measure_start = (time.monotonic(), 0, 0)  # the benchmark's measured period has begun
    groups = [{"name": f"n{k}", "node": f"10.0.0.{k + 10}", "workers": 1, "running": True, "lost": "",
               "replacements": 0, "env_steps": 12_345 * (k + 1), "traj_bytes": 3_000_000, "weights_bytes": 250_000,
               "restarts": {}} for k in range(4)]
    groups[0]["restarts"] = {"actor": 2}
    groups[3].update(node="", running=False, lost="ActorDiedError", replacements=1)
    reports.on_cluster({"seconds": 1.0, "busy": 0.9, "groups": groups})
    status = reports.status_line()
    assert_fits(status)
    assert "cluster: n0 10.0.0.10 12.3k FPS; n1 10.0.0.11 24.7k FPS; n2 10.0.0.12 37.0k FPS;" in status, status
    assert "n3 - lost (ActorDiedError), waiting for CPUs;" in status
    assert "trajectories in 12.0MB/s, weights out 1.00MB/s, head busy 90%" in status
    assert "restarts: actor 2, learner 1, sampler group 1" in status
    summary = reports.benchmark_summary("CartPole-v1")
    assert summary["cluster"] == {"groups": 4, "trajectory_bytes_per_s": 12e6, "weights_bytes_per_s": 1e6,
                                  "head_busy": 0.9}
    assert summary["bottleneck"].startswith("network: the head's cluster process is busy 90%")
