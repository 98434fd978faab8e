"""Fault injection: workers killed, envs that hang, raise or return NaN, updates that diverge.

The end-to-end tests run the real trainer (2 workers x 4 envs, CartPole) and kill its processes by name (each
worker names itself after its role); the learner tests drive real learners in-process.
"""

import contextlib
import json
import os
import pathlib
import re
import signal
import time

import psutil
import pytest
import torch

from appo.learning.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint
from appo.learning.learner import MAX_CONSECUTIVE_SKIPPED
from appo.learning.ppo import replace_nonfinite_
from appo.messages import SetHyperparams, WorkerFailed, WorkerReady
from appo.run.roles import Role, nothing_to_lower
from appo.run.supervisor import Supervisor
from appo.sampling.env_stepper import FAILING_ENV_ERRORS
from appo.utils.process import FatalError
from appo.utils.queues import make_queue
from tests.conftest import final_reward, wait_for

SMALL = ["--num_workers=2", "--num_envs_per_worker=4", "--report_interval=1", "--decorrelate_envs_on_one_worker=False"]


def worker_process(trainer_process, name: str, timeout: float = 30) -> psutil.Process:
    """The trainer's child process named `name` (actor_0, inference_0, learner_p0, ...)."""

    def named() -> psutil.Process | None:
        for child in psutil.Process(trainer_process.pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.name() == name:
                    return child
        return None

    return wait_for(named, timeout, f"process named {name}")


def wait_for_log(log: pathlib.Path, pattern: str, timeout: float, count: int = 1) -> float:
    """Seconds until `pattern` (a regex) appears `count` times in the log."""
    start = time.monotonic()
    wait_for(lambda: log.exists() and len(re.findall(pattern, log.read_text())) >= count, timeout, repr(pattern),
             interval=0.05, details=lambda: log.read_text()[-3000:] if log.exists() else "(no log)")
    return time.monotonic() - start


def stop(trainer_process) -> None:
    """After a failed assertion: stop the trainer the way a user would (it then cleans up)."""
    if trainer_process.poll() is None:
        trainer_process.send_signal(signal.SIGINT)
        try:
            trainer_process.communicate(timeout=20)
        except Exception:
            trainer_process.kill()
            raise


def kill(trainer_process, name: str) -> int:
    process = worker_process(trainer_process, name)
    os.kill(process.pid, signal.SIGKILL)
    return process.pid


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_killed_actor_inference_worker_and_learner_are_replaced_within_2_s_and_the_run_goes_on(trainer):
    process = trainer.start("--env=CartPole-v1", "--experiment=kills", "--train_for_seconds=30", *SMALL)
    log = pathlib.Path(trainer.train_dir, "kills", "log.txt")
    try:
        wait_for_log(log, r"\bp0: v\d+, reward", 40)  # policy 0's status line shows a mean reward
        for name in ("actor_0", "inference_0", "learner_p0"):
            versions = [int(v) for v in re.findall(r"p0: v(\d+)", log.read_text())]
            old_pid = kill(process, name)
            noticed = wait_for_log(log, rf"{name} died \(killed by SIGKILL\); replaced it", 10)
            assert noticed < 2.0
            replacement = worker_process(process, name)
            assert replacement.pid != old_pid
            wait_for_log(log, rf"restarts: .*{name.split('_')[0]} 1", 10)
            if name == "learner_p0":  # it continues from the weights published last, not from version 0
                wait_for_log(log, r"policy 0: learner replaced; continues as version \d+", 20)
                match = re.search(r"policy 0: learner replaced; continues as version (\d+)", log.read_text())
                assert int(match.group(1)) >= versions[-1] > 0
        output, _ = process.communicate(timeout=60)
    finally:
        stop(process)
    assert process.returncode == 0, output
    assert "restarts: actor 1, inference 1, learner 1" in output
    assert final_reward(trainer.train_dir, "kills") > 50  # still learning after every component died once


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_worker_that_dies_more_than_max_worker_restarts_stops_the_run_with_the_cause(trainer):
    process = trainer.start("--env=CartPole-v1", "--experiment=crash_loop", "--max_worker_restarts=1", *SMALL)
    log = pathlib.Path(trainer.train_dir, "crash_loop", "log.txt")
    try:
        wait_for_log(log, r"FPS", 40)
        kill(process, "actor_1")
        wait_for_log(log, r"actor_1 died \(killed by SIGKILL\); replaced it", 10)
        kill(process, "actor_1")  # the replacement
        output, _ = process.communicate(timeout=30)
    finally:
        stop(process)
    assert process.returncode == 1
    assert ("actor_1 died more than --max_worker_restarts=1 times within an hour; last cause: killed by SIGKILL"
            in output)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_an_env_step_that_hangs_gets_its_actor_replaced_and_named(trainer):
    """HangingCartPole blocks in step forever after 200 steps: each hang costs one restart, named in the log."""
    result = trainer.run("--env=tests.flaky_envs:HangingCartPole-v0", "--experiment=hang", "--num_workers=1",
                         "--num_envs_per_worker=2", "--env_timeout_seconds=2", "--max_worker_restarts=1",
                         "--decorrelate_envs_on_one_worker=False", timeout=80)
    assert result.returncode == 1
    output = result.stdout + result.stderr
    hang = r"stuck for \d+ s in env\.step of its env [01] \(--env_timeout_seconds=2\)"
    assert re.search(rf"actor_0 died \({hang}\); replaced it", output), output[-3000:]
    assert re.search(rf"actor_0 died more than --max_worker_restarts=1 times within an hour; last cause: {hang}",
                     output), output[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_nan_observations_and_rewards_are_set_to_zero_reported_once_per_env_and_never_reach_the_model(trainer):
    result = trainer.run("--env=tests.flaky_envs:NaNCartPole-v0", "--experiment=nan", "--train_for_env_steps=100000",
                         *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    rewards = re.findall(r"actor (\d): env (\d) of split (\d) returned a non-finite reward", output)
    observations = re.findall(r"actor (\d) env (\d) returned a non-finite observation \(field 'obs'\)", output)
    assert rewards and observations
    assert len(rewards) == len(set(rewards)) and len(observations) == len(set(observations))  # once per env
    assert int(re.findall(r"non-finite values (\d+)", output)[-1]) > len(rewards) + len(observations)
    last_status = [line for line in output.splitlines() if re.search(r"\bp0: v\d+", line)][-1]  # policy 0's line
    assert "nan" not in last_status
    assert final_reward(trainer.train_dir, "nan") > 50  # the policy did not collapse
    state = load_checkpoint(latest_checkpoint(checkpoint_dir(os.path.join(trainer.train_dir, "nan"), 0)), "cpu")
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_multi_agent_env_that_raises_costs_only_the_episode(trainer):
    result = trainer.run("--env=tests.flaky_envs:make_flaky_rendezvous", "--experiment=flaky_ma",
                         "--train_for_env_steps=40000", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    errors = re.findall(r"env errors (\d+)", result.stdout + result.stderr)
    assert errors and int(errors[-1]) >= 10
    assert "restarts" not in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_env_that_raises_in_nearly_every_episode_stops_the_run_and_one_in_half_does_not(trainer):
    """A rare env error costs its episode; envs that raise in FAILING_ENV_SHARE of their episodes train on nothing
    (before, such a run completed with every episode lost). Errors in the random steps that spread the envs apart at
    start are counted the same way (before, the first one stopped the run as a crash at start)."""
    broken = trainer.run("--env=tests.flaky_envs:FailingEpisodesCartPole-v0", "--experiment=broken",
                         "--train_for_env_steps=200000", *SMALL)
    assert broken.returncode == 1
    output = broken.stdout + broken.stderr
    assert re.search(rf"stopped the run: its envs raised in {FAILING_ENV_ERRORS} of the (\d+) episodes they ended or "
                     r"lost \(RuntimeError: this episode fails on purpose at ", output), output[-3000:]
    flaky = trainer.run("--env=tests.flaky_envs:FailingEpisodesCartPole-v0", '--env_kwargs={"share": 0.5}',
                        "--experiment=flaky", "--train_for_env_steps=5000", *SMALL,
                        "--decorrelate_envs_on_one_worker=True")
    assert flaky.returncode == 0, flaky.stdout[-3000:] + flaky.stderr[-3000:]
    with open(os.path.join(trainer.train_dir, "flaky", "result.json")) as f:
        assert json.load(f)["faults"]["env_errors"] >= 10


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_updates_that_keep_diverging_stop_the_run_with_a_clear_message(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=diverge", "--learning_rate=1e30", *SMALL)
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert (f"learner_p0 stopped the run: policy 0: the last {MAX_CONSECUTIVE_SKIPPED} updates had a non-finite "
            "loss or gradient") in output
    path = latest_checkpoint(checkpoint_dir(os.path.join(trainer.train_dir, "diverge"), 0))
    if path is not None:
        state = load_checkpoint(path, "cpu")
        assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


# ---------------------------------------------------------------- the learner, in-process
def test_a_non_finite_loss_skips_the_update_and_a_run_of_them_is_fatal(learners):
    (learner, _), traj = learners
    slots = list(range(learner.trajs_per_iteration))
    traj.policy_ids[slots] = 0
    learner.on_message(SetHyperparams({"value_loss_coeff": float("nan")}))  # every loss is NaN from here on
    before = [p.detach().clone() for p in learner.policy.model.parameters()]
    learner.train_iteration(slots)
    assert learner.counters.skipped_updates > 0 and learner.policy.train_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, learner.policy.model.parameters()))
    with pytest.raises(FatalError, match="non-finite loss or gradient"):
        for _ in range(MAX_CONSECUTIVE_SKIPPED):
            traj.policy_versions[slots] = learner.policy.version
            learner.train_iteration(slots)


def test_non_finite_inputs_of_a_batch_are_zeroed_and_counted():
    batch = {"obs": {"obs": torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]]),
                     "pixels": torch.ones(2, 2, dtype=torch.uint8)},
             "rewards": torch.tensor([float("-inf"), 1.0])}
    assert replace_nonfinite_(batch) == 3
    assert batch["obs"]["obs"].tolist() == [[1.0, 0.0], [0.0, 2.0]] and batch["rewards"].tolist() == [0.0, 1.0]


def test_a_replacement_learner_continues_from_the_published_weights_and_finds_every_owed_slot(learner_rig):
    learner = learner_rig.learner(0)
    slots = list(range(learner.trajs_per_iteration))
    learner_rig.traj.policy_ids[:] = 0
    learner_rig.control.slot_owed[0, slots] = 1
    learner.on_message(slots)  # the actors' hint
    learner.train_iteration(learner.owed.pop(len(slots)))
    assert learner_rig.control.slot_owed[0, slots].sum() == 0  # read, so free for the actor again
    owed = [slots[-1] + 1, slots[-1] + 2]
    learner_rig.control.slot_owed[0, owed] = 1  # sent to the learner, which dies before reading them

    replacement = learner_rig.learner(0)
    assert replacement.policy.version == learner.policy.version == 1
    assert replacement.policy.env_steps == learner.policy.env_steps > 0
    assert replacement.owed.pending == owed
    obs = {"obs": torch.randn(5, 4)}
    rnn = torch.zeros(5, 1)
    with torch.no_grad():
        for a, b in zip(learner.policy.model.forward_step(obs, rnn), replacement.policy.model.forward_step(obs, rnn)):
            assert torch.equal(a, b)
    replacement.on_message(owed)  # the actor's hint arrives late: nothing is queued twice
    assert replacement.owed.pending == owed


def test_a_learner_reports_ready_so_that_a_later_crash_gets_it_replaced(learner_rig):
    learner = learner_rig.learner(0)
    learner_rig.control.runner.stop[0] = 1  # run() publishes, reports, and returns at once
    learner.run()
    assert WorkerReady("learner_p0") in learner_rig.ctx.queues.report.get_many(timeout=1)


class CrashingWorker:
    """A worker that raises, after reporting ready or before (started by the supervisor test below)."""

    @classmethod
    def main(cls, report_queue, name: str, ready: bool) -> None:
        if ready:
            report_queue.put(WorkerReady(name))
        raise RuntimeError("crashed on purpose")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ready", [True, False])
def test_a_crash_after_ready_is_replaceable_and_one_before_is_permanent(ready):
    report_queue = make_queue()
    supervisor = Supervisor(report_queue, max_restarts=3)
    role = Role("actor", lambda: CrashingWorker, nothing_to_lower)
    supervisor.add("actor_0", role, lambda: (report_queue, "actor_0", ready), inbox=make_queue())
    supervisor.workers["actor_0"].process.join(10)
    for message in report_queue.get_many(timeout=1):
        if isinstance(message, WorkerReady):
            supervisor.on_ready(message.name)
        else:
            assert isinstance(message, WorkerFailed) and not message.fatal
            supervisor.on_failed(message)
    (death,) = supervisor.deaths()
    assert death.cause == "RuntimeError: crashed on purpose"
    assert death.permanent is not ready


class SleepingWorker:
    """A worker that reports ready and sleeps until it is killed (the supervisor's group test below)."""

    @classmethod
    def main(cls, report_queue, name: str) -> None:
        report_queue.put(WorkerReady(name))
        time.sleep(3600)


@pytest.mark.timeout(30)
def test_a_death_in_a_group_restarts_the_whole_group_and_counts_once():
    report_queue = make_queue()
    supervisor = Supervisor(report_queue, max_restarts=3)
    role = Role("learner", lambda: SleepingWorker, nothing_to_lower)
    for name, group in (("rank0", "g"), ("rank1", "g"), ("alone", None)):
        supervisor.add(name, role, lambda name=name: (report_queue, name), inbox=None, group=group)
    pids = {name: worker.process.pid for name, worker in supervisor.workers.items()}
    os.kill(pids["rank1"], signal.SIGKILL)
    supervisor.workers["rank1"].process.join(10)
    try:
        assert supervisor.replace_dead([], lambda: None) is None
        now = {name: worker.process.pid for name, worker in supervisor.workers.items()}
        assert now["alone"] == pids["alone"] and now["rank0"] != pids["rank0"] and now["rank1"] != pids["rank1"]
        assert all(worker.process.is_alive() for worker in supervisor.workers.values())
        assert supervisor.restart_counts() == {"learner": 1}
        assert [w.total_restarts for w in supervisor.workers.values()] == [0, 1, 0]
    finally:
        for worker in supervisor.workers.values():
            worker.process.kill()
            worker.process.join()
