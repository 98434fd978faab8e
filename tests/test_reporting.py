"""The status and summary the runner prints: what they show, and that every line fits 120 columns with the log
prefix "[HH:MM:SS][MainProcess] " (24 characters), so 96 for the message. No processes: a Reports is fed typed reports
by hand, on a clock that moves only when a test says."""

import importlib.util
import json
import os
import re
import sys

import numpy as np
import pytest

from appo.config.cfg import parse_config
from appo.messages import ActorReport, ClusterReport, EpisodeEnd, LearnerReport
from appo.run.reporting import LINE_WIDTH, Reports
from appo.run.stopping import budget_outcome
from appo.tools.watched_run import StatusReader
from tests.conftest import REPO

PREFIX = "[10:00:00][MainProcess] "


class FakeClock:
    """Seconds that pass only when `advance` is called."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_reports(tmp_path, *flags: str, policies: int = 2) -> tuple[Reports, FakeClock]:
    """One actor worker unless `flags` say otherwise: its first report (every env ended) lets full windows count."""
    cfg = parse_config(["--env=CartPole-v1", "--num_workers=1", f"--num_policies={policies}", *flags])
    clock = FakeClock()
    return Reports(cfg, str(tmp_path), [0] * policies, clock=clock), clock


def actor_report(worker: int = 0, env_steps: int = 0, episodes: list[EpisodeEnd] | None = None, env_errors: int = 0,
                 nonfinite: int = 0, every_env_ended: bool = True, illegal_actions: int = 0) -> ActorReport:
    return ActorReport(worker=worker, env_steps=env_steps, episodes=episodes or [], games=[], timing={},
                       env_errors=env_errors, illegal_actions=illegal_actions, nonfinite=nonfinite, state="stepping",
                       every_env_ended=every_env_ended)


def learner_report(reports: Reports, policy: int, version: int, stats: dict[str, float] | None = None,
                   skipped_updates: int = 0) -> LearnerReport:
    """A learner's report that leaves the policy's env steps as they are."""
    return LearnerReport(policy=policy, stats=stats or {}, env_steps=reports.env_steps[policy], version=version,
                         samples=0, dropped=0, train_steps=0, timing={}, skipped_updates=skipped_updates,
                         nonfinite=0, device="cpu", state="training")


def episodes(policy: int, rewards: list[float], length: float = 10.0) -> ActorReport:
    return actor_report(episodes=[EpisodeEnd(policy, reward, length, None, {}) for reward in rewards])


def fill(reports: Reports, rewards: list[float], length: float = 123.4) -> None:
    """Per policy, 1234567 episodes (a full --stats_avg window and many more) with an objective, version 123456 and
    a lag."""
    for p, reward in enumerate(rewards):
        reports.on_actor(actor_report(episodes=[EpisodeEnd(p, reward, length, 0.5 + p / 10, {})] * 1_234_567))
        reports.on_learner(learner_report(reports, p, 123_456, stats={"lag_min": 0, "lag_avg": 1.2, "lag_max": 3}))


def set_step_rate(reports: Reports, clock: FakeClock, env_steps: list[int], per_second: float) -> None:
    """The learners' counters (what the runner passes to tick) reach env_steps now, at per_second over the last 50 s;
    61 s pass, and nothing moves in the first 11, so that the 60 s rate window holds just these 50 s."""
    before, owed = list(env_steps), 50 * per_second
    for p in sorted(range(len(before)), key=lambda p: -before[p]):  # counts never go back
        taken = min(owed, before[p] - reports.env_steps[p])
        before[p] -= taken
        owed -= taken
    assert owed == 0, "these counts cannot be reached at that rate"
    clock.advance(11)
    reports.tick(np.array(before))
    clock.advance(50)
    reports.tick(np.array(env_steps))


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


def test_an_objective_no_episode_reports_is_said_once_every_policy_has_a_window(tmp_path):
    """--pbt_target_objective naming a value the env's info never holds: PBT never acts, and the status line said
    'no episodes yet' for the whole run."""
    reports, _ = make_reports(tmp_path, "--with_pbt=True", "--pbt_target_objective=kills")
    for p in (0, 1):
        reports.on_learner(learner_report(reports, p, 1))
    reports.hyperparams = [{"learning_rate": 1e-3}] * 2
    reports.on_actor(episodes(0, [1.0] * 100))
    reports.on_actor(episodes(1, [1.0] * 99))
    assert "PBT objective: no episodes yet" in reports.status_line()
    reports.on_actor(episodes(1, [1.0]))
    status = reports.status_line()
    assert_fits(status)
    assert "PBT objective: none of 200 episodes reported --pbt_target_objective=kills" in status, status
    assert "PBT cannot rank the policies" in status


@pytest.mark.parametrize("policies", [2, 4])
def test_every_line_fits_with_faults_pbt_and_large_numbers(tmp_path, policies):
    reports, clock = make_reports(tmp_path, "--with_pbt=True", "--train_for_env_steps=9000000000", policies=policies)
    fill(reports, [-12345.67] * policies, length=12345.6)
    set_step_rate(reports, clock, [2_345_678_901] * policies, 123_456)
    reports.on_actor(actor_report(env_errors=123_456, nonfinite=7_890))
    for p in range(policies):
        reports.on_learner(learner_report(reports, p, 123_456, skipped_updates=3))
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
    assert f"updates skipped (non-finite) {3 * policies}" in status
    assert "restarts: actor 12, inference 3, learner 2" in status
    assert re.search(r"^  PBT objective best 0\.\d+ \(p\d\) worst 0.500 \(p0\)", status, re.M), status
    assert len(lines) > policies + 3, "the long faults line wraps onto a second line"
    reader = StatusReader()  # the watched runs of scripts/chaos.py and soak.py read policy 0's line, wrapped or not
    for line in lines:
        reader.feed(PREFIX + line, t=1.0)
    assert [(s.env_steps, s.reward) for s in reader.samples] == [(2_345_678_901 * policies, -12345.67)]

    long_path = "train_dir/" + "x" * 80 + "/checkpoint_p0/checkpoint_000123456_2345678901.pth"
    summary = reports.summary_line([long_path] + [None] * (policies - 1))
    assert_fits(summary, except_paths=True)
    lines = summary.splitlines()
    assert re.fullmatch(r"Summary: \d+\.\d s \(1m01s\), \d+ env steps", lines[0])
    assert lines[1] == "  p0: final reward -12345.67 (best -12345.67) over 100 episodes"
    assert lines[2] == f"  p0 checkpoint: {long_path}" and lines[-1] == f"  p{policies - 1} checkpoint: none"


def test_no_faults_line_without_faults_and_no_reward_before_the_first_episode(tmp_path):
    reports, _ = make_reports(tmp_path)
    status = reports.status_line()
    assert_fits(status)
    assert "faults" not in status and "restarts" not in status and "PBT" not in status and "reward" not in status
    assert status.splitlines()[0].startswith("no budget, 0s elapsed, ETA - | env steps 0 |")  # the default 1e10 steps
    assert "  p1: v0, no finished episode yet, 0 samples/s" in status
    assert reports.summary_line([None, None]).splitlines()[1:] == [
        "  p0: no finished episode", "  p0 checkpoint: none", "  p1: no finished episode", "  p1 checkpoint: none"]


@pytest.mark.parametrize("schedule, shown", [("constant", False), ("kl_adaptive", True)])
def test_a_moving_learning_rate_is_on_the_status_line(tmp_path, schedule, shown):
    """The rate --lr_schedule sets is the learner's last; a constant one says nothing new."""
    reports, _ = make_reports(tmp_path, f"--lr_schedule={schedule}")
    reports.on_learner(learner_report(reports, 0, 7, stats={"learning_rate": 0.00296, "epochs": 4.0}))
    status = reports.status_line()
    assert_fits(status)
    assert bool(re.search(r"epochs 4\.0(, |\n +)lr 0\.003", status)) == shown, status  # wrapped or not


def test_progress_of_a_step_budget_uses_the_recent_env_step_rate(tmp_path):
    reports, clock = make_reports(tmp_path, "--train_for_env_steps=1000000")
    set_step_rate(reports, clock, [100_000, 300_000], 5000)  # 600k steps left at 5k steps/s: 2 minutes
    fraction, budget, eta = reports.progress()
    assert fraction == pytest.approx(0.4) and budget == "1M steps" and eta == pytest.approx(120, rel=0.01)
    assert reports.status_line().startswith("40.0% of 1M steps in 1m01s, ETA 2m00s | env steps 400000 | FPS ")
    set_step_rate(reports, clock, [100_000, 300_000], 0)  # no progress in the last minute: ETA unknown
    assert "40.0% of 1M steps in 2m02s, ETA - |" in reports.status_line()
    set_step_rate(reports, clock, [1_000_000, 300_000], 5000)  # past the budget
    assert reports.status_line().startswith("100.0% of 1M steps in 3m03s, ETA 0s |")


def test_an_absurd_eta_is_not_shown(tmp_path):
    reports, clock = make_reports(tmp_path, "--train_for_env_steps=9000000000")
    set_step_rate(reports, clock, [1000, 1000], 10)  # 900 million seconds
    assert "0.0% of 9G steps in 1m01s, ETA - |" in reports.status_line()


def test_progress_of_a_time_budget_counts_this_session(tmp_path):
    reports, clock = make_reports(tmp_path, "--train_for_seconds=600", "--train_for_env_steps=1000000")
    clock.advance(89)
    set_step_rate(reports, clock, [50_000, 50_000], 1000)  # 10% of the step budget: the time budget is closer to done
    fraction, budget, eta = reports.progress()
    assert fraction == pytest.approx(0.25, abs=0.01) and budget == "10m00s" and eta == pytest.approx(450, abs=2)
    assert reports.status_line().startswith("25.0% of 10m00s in 2m30s, ETA 7m30s | env steps 100000 |")
    set_step_rate(reports, clock, [200_000, 200_000], 1000)  # 40% of the steps, 35% of the time: the steps are closer
    assert reports.status_line().startswith("40.0% of 1M steps in 3m31s, ETA 10m00s |")


def test_progress_of_a_benchmark_counts_the_measured_steps(tmp_path):
    reports, clock = make_reports(tmp_path, "--benchmark=True", "--sampler_only=True", "--num_workers=2", policies=1)
    clock.advance(61)
    reports.on_actor(actor_report(worker=0, env_steps=50_000))
    assert reports.progress()[0] == 0.0  # before every actor samples, nothing is measured
    reports.on_actor(actor_report(worker=1, env_steps=50_000))  # taken before the measured period began
    reports.tick()
    clock.advance(10)
    reports.on_actor(actor_report(worker=0, env_steps=250_000))
    reports.on_actor(actor_report(worker=1, env_steps=250_000))
    reports.tick()  # 500k measured env steps in 10 s: 50k env steps/s
    assert reports.status_line().startswith("25.0% of 2M benchmark steps in 1m11s, ETA 30s | env steps 0 | FPS ")


def test_the_best_reward_is_the_best_full_window_mean_seen(tmp_path):
    reports, _ = make_reports(tmp_path, "--stats_avg=10", policies=1)
    checkpoint = ["train_dir/x/checkpoint_p0/checkpoint_000000001_100.pth"]
    reports.on_actor(episodes(0, [5.0] * 9))
    reports.tick()
    assert "  p0: final reward 5.00 (best -) over 9 episodes" in reports.summary_line(checkpoint).splitlines()
    for reward in [5.0, 50.0, 50.0]:
        reports.on_actor(episodes(0, [reward]))
        reports.tick()
    reports.on_actor(episodes(0, [1.0] * 10))
    summary = reports.summary_line(checkpoint)
    assert "  p0: final reward 1.00 (best 14.00) over 10 episodes" in summary.splitlines()


def test_no_target_best_reward_or_objective_before_every_env_ended_an_episode(tmp_path):
    """doom_basic on 12 workers x 8 envs (scripts/gpu_check.py) stopped at once on --target_reward=0: every env
    starts at the same moment, so the first 100 episodes to end were a random policy's short lucky kills while its
    long failures were still running. A window counts only once every env has ended an episode."""
    reports, _ = make_reports(tmp_path, "--num_workers=12", "--num_envs_per_worker=8", "--target_reward=0",
                              policies=1)
    kill, timeout = EpisodeEnd(0, 80.0, 5, 80.0, {}), EpisodeEnd(0, -300.0, 75, -300.0, {})
    for worker in range(12):  # 120 kills before any timeout: a full window, mean 80
        reports.on_actor(actor_report(worker, episodes=[kill] * 10, every_env_ended=False))
    reports.tick()
    assert reports.solved_policy(0.0) is None and reports.objective(0) is None
    assert reports.numbers.best_rewards == [None]
    assert "reward 80.00 length 5.0 (100 of 120 episodes)" in reports.status_line()  # the status shows what ended
    for worker in range(11):  # the envs' long failures end, and more lucky kills, on all workers but the last
        reports.on_actor(actor_report(worker, episodes=[timeout] * 6 + [kill] * 2, every_env_ended=True))
    reports.tick()
    assert reports.solved_policy(0.0) is None and reports.numbers.best_rewards == [None]
    reports.on_actor(actor_report(11, episodes=[timeout] * 6 + [kill] * 2, every_env_ended=True))
    reports.tick()  # a full window of what a random policy does: no target, and the best is that window's mean
    mean = np.mean(([80.0] * 10 * 12 + ([-300.0] * 6 + [80.0] * 2) * 12)[-100:])
    assert reports.solved_policy(0.0) is None and reports.objective(0) == pytest.approx(mean)
    assert reports.numbers.best_rewards == [pytest.approx(mean)]
    reports.on_actor(actor_report(0, episodes=[kill] * 100))  # a policy that learned
    assert reports.solved_policy(0.0) == (0, 80.0)


@pytest.mark.parametrize("budget", ["--train_for_env_steps=1000", "--train_for_seconds=60"])
def test_a_run_that_meets_its_target_and_a_budget_in_one_tick_reached_the_target(tmp_path, budget):
    reports, clock = make_reports(tmp_path, "--stats_avg=10", "--target_reward=50", budget, policies=1)
    reports.on_actor(episodes(0, [60.0] * 10))
    clock.advance(61)
    reports.tick(np.array([1000]))
    outcome = budget_outcome(reports.cfg, reports, elapsed=61.0)
    assert outcome.completed and outcome.target is not None and outcome.target.mean == 60.0, outcome.reason
    assert outcome.reason.startswith("target reward 50 reached by p0"), outcome.reason


def test_a_sweeps_scores_and_pruning_read_full_windows_only(tmp_path):
    """result.json's final_rewards (final_reward's score) and the summaries' episode/full_window_reward (what the
    pruner reads) follow the rule of the targets: --stats_avg episodes, and every env has ended one."""
    from appo.launch import write_result
    from appo.run.result import RunResult, read_result
    from tests.test_tracking import tensorboard_scalars

    reports, _ = make_reports(tmp_path, "--stats_avg=10", policies=2)
    reports.on_actor(actor_report(episodes=[EpisodeEnd(0, 7.0, 5, None, {})] * 10, every_env_ended=False))
    reports.write_summaries({})
    assert reports.numbers.final_rewards() == [None, None]  # p0's window is full, but not every env ended one
    reports.on_actor(episodes(1, [3.0] * 9))
    assert reports.numbers.final_rewards() == [7.0, None]  # p1: 9 of 10
    reports.on_actor(episodes(0, [8.0]))
    reports.on_actor(episodes(1, [3.0]))
    reports.tick()
    reports.write_summaries({})
    reports.close()
    assert reports.numbers.final_rewards() == [pytest.approx(7.1), 3.0]
    numbers = reports.numbers
    write_result(str(tmp_path), RunResult("done", True, False, env_steps=100, seconds=1.0, stats=reports.final_stats(),
                                          best_rewards=dict(enumerate(numbers.best_rewards)),
                                          final_rewards=dict(enumerate(numbers.final_rewards()))))
    with open(tmp_path / "result.json") as f:
        assert json.load(f)["final_rewards"] == {"0": pytest.approx(7.1), "1": 3.0}
    assert read_result(str(tmp_path)).final_rewards == {0: pytest.approx(7.1), 1: 3.0}
    for policy, full in ((0, 7.1), (1, 3.0)):
        scalars = tensorboard_scalars(str(tmp_path), policy)
        assert len(scalars["episode/reward"]) == 2 - policy  # the status' mean, of whatever ended
        assert [value for _, value in scalars["episode/full_window_reward"]] == [pytest.approx(full)]


def test_a_watched_run_reads_the_status(tmp_path):
    reports, clock = make_reports(tmp_path, "--with_pbt=True", "--train_for_env_steps=1000000", policies=3)
    fill(reports, [10.0, 20.0, 30.0])
    set_step_rate(reports, clock, [100_000, 100_000, 100_000], 3000)
    log = [PREFIX + line for line in reports.status_line().splitlines()]
    log += [PREFIX + "Stopped: reached --train_for_env_steps=1000000"]
    log += [PREFIX + line for line in reports.summary_line([None] * 3).splitlines()]
    output = "\n".join(log) + "\n"
    status = StatusReader()
    for line in output.splitlines(keepends=True) * 2:
        status.feed(line, t=1.0)
    assert [(s.env_steps, s.reward) for s in status.samples] == [(300_000, 10.0)] * 2


def test_ratings_line_and_final_table_fit(tmp_path):
    from appo.population.ratings import Ratings

    reports, _ = make_reports(tmp_path, policies=4)
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
    reports, _ = make_reports(tmp_path, "--backend=ray", "--num_workers=4", policies=1)
    reports.restarts = {"learner": 1}
    for worker in range(4):  # every actor samples: the benchmark's measured period has begun
        reports.on_actor(actor_report(worker=worker, env_steps=100))
    groups = [{"name": f"n{k}", "node": f"10.0.0.{k + 10}", "workers": 1, "running": True, "lost": "",
               "replacements": 0, "env_steps": 12_345 * (k + 1), "traj_bytes": 3_000_000, "weights_bytes": 250_000,
               "restarts": {}} for k in range(4)]
    groups[0]["restarts"] = {"actor": 2}
    groups[3].update(node="", running=False, lost="ActorDiedError", replacements=1)
    reports.on_cluster(ClusterReport(seconds=1.0, busy=0.9, groups=groups))
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


def test_event_files_read_as_tensorboardx_writes_them(tmp_path):
    """appo writes event files with tensorboard's pieces (no torch in the runner); tensorboardX reads them
    (records, checks and messages), and a text summary is byte for byte the one tensorboardX makes."""
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c
    from tensorboardX.summary import text

    from appo.tracking.event_file import EventFile

    writer = EventFile(str(tmp_path / "summaries" / "0"))
    writer.add_scalar("perf/fps_10s", 1234.5, 0)
    writer.add_scalar("episode_extra/goal rate", 1e40, 2**40)  # a tag tensorboard refuses, beyond float32
    writer.add_text("selfplay/table", "p0 vs p1: 3 wins\n\nüber", 7)
    writer.close()
    with open(writer.path, "rb") as f:
        data = f.read()
    events = []
    while data:
        header, length = data[:8], int.from_bytes(data[:8], "little")
        record = data[12:12 + length]
        assert data[8:12] == masked_crc32c(header).to_bytes(4, "little")
        assert data[12 + length:16 + length] == masked_crc32c(record).to_bytes(4, "little")
        events.append(event_pb2.Event.FromString(record))
        data = data[16 + length:]
    assert events[0].file_version == "brain.Event:2"
    values = [(event.step, event.summary.value[0]) for event in events[1:]]
    assert [(step, value.tag, value.simple_value) for step, value in values[:2]] == [
        (0, "perf/fps_10s", 1234.5), (2**40, "episode_extra/goal_rate", float("inf"))]
    made_by_tensorboardx = text("selfplay/table", "p0 vs p1: 3 wins\n\nüber").value[0]
    assert values[2][0] == 7 and values[2][1].SerializeToString() == made_by_tensorboardx.SerializeToString()


def test_a_resumed_run_starts_with_the_last_episodes_of_the_run_before(tmp_path, caplog):
    """episodes.json: written with the summaries, read back by a resumed run's Reports (not by a new run's); the
    window keeps its newest --stats_avg; a damaged file is said and restores nothing."""
    before, _ = make_reports(tmp_path, "--stats_avg=4")
    before.on_actor(episodes(0, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    before.on_actor(episodes(1, [10.0]))
    before.write_summaries({})
    before.close()
    cfg = parse_config(["--env=CartPole-v1", "--num_workers=1", "--num_policies=2", "--stats_avg=4"])
    assert Reports(cfg, str(tmp_path), [0, 0], clock=FakeClock()).final_stats() == {}  # a new run: none
    resumed = Reports(cfg, str(tmp_path), [600, 10], clock=FakeClock())
    stats = resumed.final_stats()
    assert (stats[0]["reward"], stats[0]["episodes"], stats[1]["reward"]) == (4.5, 4, 10.0)
    assert resumed.tally.policies[0].episodes.total == 6
    resumed.on_actor(episodes(0, [7.0]))
    assert resumed.final_stats()[0]["reward"] == 5.5  # 4, 5, 6, 7
    resumed.close()
    (tmp_path / "episodes.json").write_text("{not json")
    damaged = Reports(cfg, str(tmp_path), [600, 10], clock=FakeClock())
    assert damaged.final_stats() == {}
    assert "episodes.json is damaged" in caplog.text
    damaged.close()
