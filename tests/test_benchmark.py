"""Benchmark mode, sampler-only mode and the benchmark scripts, with tiny budgets."""

import json
import os
import subprocess
import sys

import gymnasium as gym
import pytest

from appo.config.cfg import parse_config
from appo.learning.checkpoint import checkpoint_dir, latest_checkpoint, parse_name
from appo.messages import ActorReport
from appo.run.reporting import TIME_SHARES, Reports, diagnose
from appo.tools.raw_limit import machine_raw_limit
from tests.conftest import REPO, leaked_segments

TINY = ["--num_workers=2", "--num_envs_per_worker=4", "--batch_size=256", "--decorrelate_envs_on_one_worker=False"]


def read_summary(train_dir: str, experiment: str) -> dict:
    with open(os.path.join(train_dir, experiment, "benchmark.json")) as f:
        return json.load(f)


def hand_made_summary(actor: dict, inference: dict, learner: dict, cpu_busy: float, sampler_only=False,
                      device="cpu") -> dict:
    return {"time_shares": {"actor": actor, "inference": inference, "learner": learner}, "cpu_busy": cpu_busy,
            "cpu_count": 2, "processes": 5, "sampler_only": sampler_only, "actor_niceness": 0, "device": device}


@pytest.mark.parametrize("actor, inference, learner, cpu_busy, expected", [
    # actors blocked on trajectory slots while SGD runs flat out: the learner limits
    ({"env_step": 0.3, "wait_actions": 0.1, "wait_buffers": 0.6}, {"forward": 0.2}, {"sgd": 0.9, "batching": 0.05},
     1.0, "learner:"),
    # inference busy while actors wait for actions, cores idle: add inference workers
    ({"env_step": 0.2, "wait_actions": 0.7, "wait_buffers": 0.0}, {"forward": 0.9}, {"sgd": 0.1, "batching": 0.0},
     0.5, "--policy_workers_per_policy"),
    # the same on saturated cores: more inference workers cannot help, niceness can
    ({"env_step": 0.2, "wait_actions": 0.7, "wait_buffers": 0.0}, {"forward": 0.9}, {"sgd": 0.1, "batching": 0.0},
     0.97, "--actor_niceness=10"),
    # actors busy stepping, cores free: more workers
    ({"env_step": 0.9, "wait_actions": 0.05, "wait_buffers": 0.0}, {"forward": 0.2}, {"sgd": 0.1, "batching": 0.0},
     0.4, "raise --num_workers"),
    # actors busy stepping on saturated cores: the env or the machine
    ({"env_step": 0.9, "wait_actions": 0.05, "wait_buffers": 0.0}, {"forward": 0.2}, {"sgd": 0.1, "batching": 0.0},
     0.95, "more cores (cores 95% busy)"),
])
def test_bottleneck_line_names_the_limiting_component(actor, inference, learner, cpu_busy, expected):
    assert expected in diagnose(hand_made_summary(actor, inference, learner, cpu_busy))


LEARNER_BOUND = ({"env_step": 0.3, "wait_actions": 0.1, "wait_buffers": 0.6}, {"forward": 0.2},
                 {"sgd": 0.9, "batching": 0.05})
INFERENCE_BOUND = ({"env_step": 0.2, "wait_actions": 0.7, "wait_buffers": 0.0}, {"forward": 0.9},
                   {"sgd": 0.1, "batching": 0.0})


@pytest.mark.parametrize("shares", [LEARNER_BOUND, INFERENCE_BOUND])
@pytest.mark.parametrize("cpu_busy", [0.5, 0.97])
def test_the_bottleneck_line_offers_the_gpu_only_to_a_run_on_the_cpu(shares, cpu_busy):
    on_cpu = diagnose(hand_made_summary(*shares, cpu_busy, device="cpu"))
    on_gpu = diagnose(hand_made_summary(*shares, cpu_busy, device="cuda:0"))
    assert "--device=cuda" in on_cpu and "--device=cuda" not in on_gpu
    assert on_cpu.split(":")[0] == on_gpu.split(":")[0]  # the same component limits either way
    if shares is LEARNER_BOUND:
        assert "--batch_size" in on_gpu and "--learner_torch_threads" not in on_gpu


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_benchmark_summary_has_every_field_with_sane_values(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=bench", "--benchmark=True",
                         "--benchmark_env_steps=30000", "--benchmark_raw_limit_s=1", *TINY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Benchmark: CartPole-v1" in result.stdout and "bottleneck:" in result.stdout
    summary = read_summary(trainer.train_dir, "bench")
    raw = summary["raw_limit"]  # every core stepping a worker's envs, nothing else: far above a learning trainer
    assert (raw["processes"], raw["envs_per_process"], raw["batched"]) == (len(os.sched_getaffinity(0)), 4, False)
    assert raw["env_frames_per_s"] > summary["env_frames_per_s"]
    assert summary["fraction_of_raw_limit"] == pytest.approx(summary["env_frames_per_s"] / raw["env_frames_per_s"])
    assert f"the trainer ran at {summary['fraction_of_raw_limit']:.0%} of it" in result.stdout
    assert summary["env_steps"] >= 25000 and summary["env_frames"] == summary["env_steps"]
    assert 1000 < summary["env_frames_per_s"] < 1e6
    assert 0 < summary["samples_per_s"] <= 2 * summary["env_steps_per_s"]
    assert 0 < summary["measured_seconds"] <= summary["wall_seconds"]
    assert 0 <= summary["policy_lag"]["min"] <= summary["policy_lag"]["avg"] <= summary["policy_lag"]["max"]
    for component, keys in TIME_SHARES.items():
        shares = summary["time_shares"][component]
        assert set(shares) == set(keys) | {"other"}
        assert all(0.0 <= value <= 1.0 for value in shares.values())
        assert sum(shares.values()) == pytest.approx(1.0, abs=0.02)
    assert summary["time_shares"]["learner"]["sgd"] > 0 and summary["bottleneck"]
    # 2 workers x 4 envs in 2 splits: a forward pass serves 1 to 4 requests of 2 observations.
    assert 2 <= summary["inference_batch_size"] <= 8
    assert 0.0 < summary["cpu_busy"] <= 1.0


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sampler_only_performs_no_sgd_step(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=sampler", "--benchmark=True", "--sampler_only=True",
                         "--benchmark_env_steps=30000", "--benchmark_raw_limit_s=0", *TINY)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_summary(trainer.train_dir, "sampler")
    assert summary["sampler_only"] and summary["env_steps"] >= 25000
    assert "raw_limit" not in summary and "raw limit" not in result.stdout  # --benchmark_raw_limit_s=0
    assert summary["samples_per_s"] == 0 and summary["time_shares"]["learner"]["sgd"] == 0
    version, env_steps = parse_name(latest_checkpoint(checkpoint_dir(os.path.join(trainer.train_dir, "sampler"), 0)))
    assert version == 0 and env_steps >= 25000  # trajectories were counted and recycled, never learned from


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_scripts_run_end_to_end(tmp_path):
    shm_before = set(os.listdir("/dev/shm"))
    sampler = subprocess.run([sys.executable, "scripts/bench_sampler.py", "--env=CartPole-v1", "--num_workers=1",
                              "--num_envs_per_worker=4", "--seconds=1"], cwd=REPO, capture_output=True, text=True,
                             timeout=100)
    assert sampler.returncode == 0, sampler.stdout + sampler.stderr
    assert "raw limit" in sampler.stdout and "ratio" in sampler.stdout
    out = tmp_path / "scaling"
    scaling = subprocess.run([sys.executable, "scripts/bench_scaling.py", "--max_workers=2", "--seconds=1",
                              f"--out={out}"], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert scaling.returncode == 0, scaling.stdout + scaling.stderr
    rows = json.loads((tmp_path / "scaling.json").read_text())["rows"]
    assert [row["workers"] for row in rows] == [1, 2]
    assert all(row["raw"] > 0 and row["trainer"] > 0 for row in rows)
    assert leaked_segments(shm_before) == set()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_raw_limit_of_batched_sampling_steps_the_vectorised_envs():
    raw = machine_raw_limit("CartPole-v1", {}, num_envs=64, num_splits=2, batched=True, seconds=0.5)
    single = machine_raw_limit("CartPole-v1", {}, num_envs=64, num_splits=2, batched=False, seconds=0.5)
    assert raw["batched"] and raw["processes"] == len(os.sched_getaffinity(0))
    assert raw["env_frames_per_s"] > single["env_frames_per_s"] > 0  # 32 sub-envs a native call beat 64 env.step()s


def test_throughput_counts_only_steps_taken_after_every_actor_sampled(tmp_path):
    cfg = parse_config(["--env=CartPole-v1", "--num_workers=2", "--benchmark=True"])
    now = [100.0]  # a fake clock: the half second between the reports passes at once
    reports = Reports(cfg, str(tmp_path), [0], clock=lambda: now[0])

    def report(worker: int, env_steps: int) -> None:
        reports.on_actor(ActorReport(worker=worker, env_steps=env_steps, episodes=[], games=[], timing={}, env_errors=0,
                                     illegal_actions=0, nonfinite=0, state="", every_env_ended=False))

    report(0, 5000)  # both actors' first reports cover their start-up second: not measured
    report(1, 5000)
    now[0] += 0.5
    report(0, 250)
    report(1, 250)
    summary = reports.benchmark_summary("CartPole-v1")
    reports.close()
    assert summary["env_steps"] == 500
    assert summary["env_steps_per_s"] == pytest.approx(1000)


@pytest.mark.timeout(60)
def test_the_raw_limit_counts_what_plain_processes_step():
    """Two processes of 2 envs stepping 1 ms each: at most 2 x 1,000 env steps/s, and well above none."""
    from appo.tools.raw_limit import raw_limit

    fps = raw_limit("sleep_env", num_processes=2, num_envs=2, seconds=0.5, env_kwargs={"step_seconds": 0.001})
    assert 200 < fps <= 2_000


def test_the_cnn_benchmark_builds_a_minibatch_of_whole_trajectories():
    """scripts/bench_cnn.py's minibatch: --rollout steps per trajectory, actions the model can score, and a time per
    call that counts calls."""
    import torch

    from appo.learning.model import ActorCritic
    from appo.learning.precision import minibatch, seconds_per_call

    cfg = parse_config(["--env=CartPole-v1", "--rollout=8", "--device=cpu"])
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    model = ActorCritic(obs_space, action_space, cfg)
    mb, advantages, targets = minibatch(model, obs_space, samples=32, cfg=cfg)
    assert mb["obs"]["obs"].shape == (4, 9, 4) and mb["actions"].shape == (4, 8)
    assert advantages.shape == targets.shape == (4, 8)
    assert torch.isfinite(mb["log_probs"]).all() and set(mb["actions"].unique().tolist()) <= {0, 1}
    calls = []
    assert seconds_per_call(lambda: calls.append(1), min_seconds=0.0, min_calls=3) >= 0 and len(calls) == 3
