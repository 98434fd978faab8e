"""End-to-end runs of the real trainer (processes, shared memory, queues), each well under a minute."""

import json
import os
import pathlib
import re
import signal
import time

import psutil
import pytest

from appo.learning.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint, parse_name
from tests.conftest import final_reward, shm_entries, wait_for

FAST = ["--num_workers=2", "--num_envs_per_worker=8", "--report_interval=1", "--decorrelate_envs_on_one_worker=False"]


@pytest.mark.timeout(90)
def test_cartpole_learns(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=learns", "--train_for_env_steps=120000", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    # A random policy averages about 22; learning takes it far above that within 120k steps.
    assert final_reward(trainer.train_dir, "learns") > 80
    exp_dir = os.path.join(trainer.train_dir, "learns")
    for name in ("cfg.json", "log.txt", "done"):
        assert os.path.exists(os.path.join(exp_dir, name))
    assert os.listdir(os.path.join(exp_dir, "summaries", "0"))
    version, env_steps = parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))
    assert env_steps >= 120000 and version > 10


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_two_inference_workers_share_the_actors(trainer):
    # Actors 0 and 2 are served by inference worker 0, actor 1 by worker 1: every actor must get answers.
    result = trainer.run("--env=CartPole-v1", "--experiment=two_inference", "--train_for_env_steps=120000",
                         "--policy_workers_per_policy=2", "--num_workers=3", "--num_envs_per_worker=8",
                         "--report_interval=1", "--decorrelate_envs_on_one_worker=False")
    assert result.returncode == 0, result.stdout + result.stderr
    assert final_reward(trainer.train_dir, "two_inference") > 80


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux-only")
@pytest.mark.timeout(60)
def test_actors_run_under_sched_batch_and_the_rest_do_not(trainer):
    process = trainer.start("--env=CartPole-v1", "--experiment=sched", "--num_workers=3", "--num_envs_per_worker=4",
                            "--decorrelate_envs_on_one_worker=False")
    try:
        log = pathlib.Path(trainer.train_dir, "sched", "log.txt")
        wait_for(lambda: log.exists() and "FPS" in log.read_text(), 40, "status line (all workers up)",
                 interval=0.2)
        policies = [os.sched_getscheduler(child.pid) for child in psutil.Process(process.pid).children()]
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=15)
    # Three actors; the inference worker and the learner keep the default policy, so actors never delay them.
    assert sorted(policies) == sorted([os.SCHED_BATCH] * 3 + [os.SCHED_OTHER] * 2)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_actors_never_load_torch(trainer):
    """Actors see the shared buffers through numpy; torch is mapped only into inference and learner processes. The
    runner, which forks them, never loads it, not even for tensorboardX once summaries are written."""
    process = trainer.start("--env=CartPole-v1", "--experiment=no_torch", "--num_workers=3", "--num_envs_per_worker=4",
                            "--decorrelate_envs_on_one_worker=False", "--report_interval=0.5",
                            "--experiment_summaries_interval=0.5")
    try:
        log = pathlib.Path(trainer.train_dir, "no_torch", "log.txt")
        summaries = pathlib.Path(trainer.train_dir, "no_torch", "summaries", "0")
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not (log.exists() and re.search(r"env steps [1-9]", log.read_text())
                                                   and any(summaries.glob("events.*"))):
            time.sleep(0.2)
        assert any(summaries.glob("events.*")), "no summary written"
        mapped = []
        for child in psutil.Process(process.pid).children():
            with open(f"/proc/{child.pid}/maps") as f:
                mapped.append("libtorch" in f.read())
        with open(f"/proc/{process.pid}/maps") as f:
            runner_maps_torch = "libtorch" in f.read()
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=15)
    assert sorted(mapped) == [False] * 3 + [True] * 2  # 3 actors without; inference and learner with
    assert not runner_maps_torch


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_workers_die_with_the_main_process_and_its_segment_is_removed_next_time(trainer):
    process = trainer.start("--env=CartPole-v1", "--experiment=orphan", *FAST)
    log = pathlib.Path(trainer.train_dir, "orphan", "log.txt")
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not (log.exists() and re.search(r"env steps [1-9]", log.read_text())):
        time.sleep(0.2)
    workers = psutil.Process(process.pid).children()
    segments = {name for name in shm_entries() if name.startswith(f"appo_{process.pid}_")}
    assert len(workers) == 4 and len(segments) == 1
    process.kill()  # as the OOM killer would: no chance to stop anyone or unlink anything
    process.communicate(timeout=10)
    killed_at = time.monotonic()
    while any(worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE for worker in workers):
        assert time.monotonic() - killed_at < 5, "workers must exit within 5 s of the main process"
        time.sleep(0.05)
    assert segments <= shm_entries()  # left behind by the kill

    result = trainer.run("--env=CartPole-v1", "--experiment=after", "--train_for_env_steps=3000", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Removed 1 shared-memory segments left by runs whose main process died" in result.stdout
    assert not segments & shm_entries()


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("batched", [False, True])
def test_the_random_steps_that_spread_the_envs_make_no_episode(trainer, batched):
    """--decorrelate_envs_on_one_worker walks each env a random number of steps before training: the episode it ends
    in began uncounted, and was reported as one of 149 or 160 steps of Pendulum's 200 with a partial return."""
    exp = f"spread_{batched}"
    result = trainer.run("--env=Pendulum-v1", f"--experiment={exp}", "--num_workers=1", "--num_envs_per_worker=4",
                         f"--batched_sampling={batched}", "--decorrelate_envs_on_one_worker=True",
                         "--train_for_env_steps=6000", "--seed=1")
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(trainer.train_dir, exp, "episodes.json")) as f:
        episodes = json.load(f)["policies"][0]
    assert episodes["total"] >= 20 and {length for _, length in episodes["recent"]} == {200}


@pytest.mark.timeout(90)
def test_interrupt_saves_and_resume_continues(trainer):
    args = ["--env=CartPole-v1", "--experiment=resume", *FAST]
    process = trainer.start(*args)
    exp_dir = os.path.join(trainer.train_dir, "resume")
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:  # let it learn for a few versions first
        log = os.path.join(exp_dir, "log.txt")
        if os.path.exists(log):
            with open(log) as f:
                if re.search(r"p0: v([1-9][0-9]+)", f.read()):
                    break
        time.sleep(0.2)
    interrupted_at = time.monotonic()
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=15)
    assert time.monotonic() - interrupted_at < 10, "Ctrl-C must exit within 10 s"
    assert process.returncode == 0, output
    assert not os.path.exists(os.path.join(exp_dir, "done"))
    saved_version, saved_steps = parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))
    assert saved_version >= 10 and saved_steps > 0

    # A budget it has passed would stop it at once and mark it done: refused, as for a finished run.
    too_low = trainer.run(*args, f"--train_for_env_steps={saved_steps}")
    assert too_low.returncode == 2, too_low.stdout + too_low.stderr
    assert too_low.stderr.strip() == f"error: --train_for_env_steps={saved_steps}: the experiment {exp_dir} already " \
        f"has {saved_steps} env steps; to train it further give --train_for_env_steps above {saved_steps}"
    assert not os.path.exists(os.path.join(exp_dir, "done"))

    result = trainer.run(*args, f"--train_for_env_steps={saved_steps + 20000}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resumed from" in result.stdout and f"(version {saved_version}, {saved_steps} env steps)" in result.stdout
    assert "Resume override: --train_for_env_steps" in result.stdout
    version, env_steps = parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))
    assert version > saved_version and env_steps >= saved_steps + 20000

    again = trainer.run(*args)
    assert again.returncode == 0 and "already finished" in again.stdout
    assert f"raise its budget on the command line (--train_for_env_steps above {env_steps} env steps" in again.stdout


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_finished_run_is_extended_by_raising_its_budget(trainer):
    args = ["--env=CartPole-v1", "--experiment=extend", *FAST]
    exp_dir = os.path.join(trainer.train_dir, "extend")
    done = os.path.join(exp_dir, "done")
    first = trainer.run(*args, "--train_for_env_steps=20000")
    assert first.returncode == 0, first.stdout + first.stderr
    _, first_steps = parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))
    assert first_steps >= 20000 and os.path.exists(done)

    same = trainer.run(*args, "--train_for_env_steps=20000")  # the same command again: finished, and how to extend
    assert same.returncode == 0, same.stdout + same.stderr
    assert "is already finished (reached --train_for_env_steps=20000)" in same.stdout
    assert f"--train_for_env_steps above {first_steps} env steps" in same.stdout

    too_low = trainer.run(*args, f"--train_for_env_steps={first_steps}")  # nothing left to train
    assert too_low.returncode == 2, too_low.stdout + too_low.stderr
    lines = too_low.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --train_for_env_steps={first_steps}: "), too_low.stderr
    assert f"already has {first_steps} env steps; to train it further give --train_for_env_steps above " \
           f"{first_steps}" in lines[0]
    assert os.path.exists(done) and parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))[1] == first_steps

    longer = trainer.run(*args, "--train_for_env_steps=50000")
    output = longer.stdout + longer.stderr
    assert longer.returncode == 0, output
    assert f"Extending the finished experiment {exp_dir}: --train_for_env_steps=20000 -> 50000" in output
    assert f", {first_steps} env steps)" in output  # resumed where the first run ended
    _, steps = parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))
    assert steps >= 50000 and int(re.findall(r"env steps (\d+)", longer.stdout)[-1]) >= 50000
    assert os.path.exists(done)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_two_policies_both_train(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=two", "--num_policies=2", "--train_for_env_steps=60000",
                         *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    exp_dir = os.path.join(trainer.train_dir, "two")
    for policy in (0, 1):
        version, env_steps = parse_name(latest_checkpoint(checkpoint_dir(exp_dir, policy)))
        assert version > 3 and env_steps > 10000
        assert os.listdir(os.path.join(exp_dir, "summaries", str(policy)))
        assert re.search(rf"\bp{policy}: v\d+, reward", result.stdout)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_return_normalisation_learns_with_unscaled_rewards(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=popart", "--normalize_returns=True", "--reward_scale=1.0",
                         "--train_for_env_steps=120000", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert final_reward(trainer.train_dir, "popart") > 80
    exp_dir = os.path.join(trainer.train_dir, "popart")
    state = load_checkpoint(latest_checkpoint(checkpoint_dir(exp_dir, 0)), "cpu")["model"]
    # Unscaled CartPole returns are tens of reward units: the running stats must have followed them.
    assert state["returns_norm.mean"].item() > 5 and state["returns_norm.var"].item() > 1


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_gru_core_and_vtrace_learn(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=gru", "--use_rnn=True", "--recurrence=8",
                         "--with_vtrace=True", "--train_for_env_steps=100000", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert final_reward(trainer.train_dir, "gru") > 60


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_env_exceptions_cost_an_episode_not_the_worker(trainer):
    result = trainer.run("--env=tests.flaky_envs:FlakyCartPole-v0", "--experiment=flaky",
                         "--train_for_env_steps=30000", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "raised; rebuilding it" in result.stdout and "flaky env failed on purpose" in result.stdout
    # The traceback is logged once per worker (2 here); every later failure is only counted.
    assert 1 <= result.stdout.count("raised; rebuilding it") <= 2
    assert result.stdout.count("Traceback (most recent call last)") == result.stdout.count("raised; rebuilding it")
    errors = [int(n) for n in re.findall(r"env errors (\d+)", result.stdout)]
    assert errors and errors[-1] > 10  # one failure every 500 steps of a worker: about 60 in 30k steps


@pytest.mark.timeout(60)
def test_worker_crash_is_reported_with_its_cause(trainer):
    result = trainer.run("--env=tests.flaky_envs:BrokenResetCartPole-v0", "--experiment=broken", *FAST)
    assert result.returncode == 1
    assert "Run failed: actor_" in result.stdout and "reset is broken on purpose" in result.stdout


SEEDED = ["--env=CartPole-v1", "--seed=3", "--num_workers=1", "--worker_num_splits=1", "--num_envs_per_worker=8",
          "--batch_size=512", "--num_batches_per_iteration=1", "--train_for_env_steps=12000"]


def final_weights(trainer, name: str, *args: str) -> tuple[tuple[int, int], dict]:
    """Train a run, then its newest checkpoint's (version, env steps) and weights."""
    import torch

    result = trainer.run(f"--experiment={name}", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    path = latest_checkpoint(checkpoint_dir(os.path.join(trainer.train_dir, name), 0))
    return parse_name(path), torch.load(path, weights_only=False)["model"]


def same_weights(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_seeded_single_worker_run_is_repeatable(trainer):
    (name_a, model_a), (name_b, model_b) = (final_weights(trainer, name, *SEEDED) for name in ("seed_a", "seed_b"))
    assert name_a == name_b and name_a[0] > 5
    assert same_weights(model_a, model_b)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_serial_mode_gives_the_multiprocess_runs_result(trainer):
    name_processes, model_processes = final_weights(trainer, "processes", *SEEDED)
    name_serial, model_serial = final_weights(trainer, "serial", *SEEDED, "--serial_mode=True")
    assert name_serial == name_processes and name_serial[0] > 5
    assert same_weights(model_serial, model_processes)


@pytest.mark.timeout(90)
def test_serial_mode_runs_a_whole_run_in_this_process(tmp_path):
    from appo import train
    from appo.hooks import Hooks

    children_seen = []
    result = train(env="CartPole-v1", experiment="serial", train_dir=str(tmp_path), serial_mode=True,
                   num_workers=2, train_for_env_steps=30_000,
                   hooks=Hooks(on_learner_iteration=[lambda event: children_seen.append(psutil.Process().children())]))
    assert result.env_steps >= 30_000 and result.checkpoint is not None
    assert len(children_seen) > 5 and not any(children_seen)  # every iteration was trained with no child process


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_stall_is_reported_not_a_silent_hang(trainer):
    result = trainer.run("--env=tests.flaky_envs:HangingCartPole-v0", "--experiment=hang", "--stall_timeout_seconds=4",
                         *FAST)
    assert result.returncode == 1
    assert "Run failed: no env step for" in result.stdout
    # Each actor is named with the env call it is stuck in; the others with their last report and its age.
    assert re.search(r"actor_0: inside env\.step of env \d+ for \d+ s", result.stdout), result.stdout[-2000:]
    assert re.search(r"learner_p0: [^;]* \(reported \d+ s ago\)", result.stdout), result.stdout[-2000:]
