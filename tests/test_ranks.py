"""--learner_processes_per_policy: several learner processes (ranks) train one policy (appo/learning/ranks.py).

The equivalence and drift tests run real learners over the shared buffers of a `LearnerRig` (rank 0 a `Learner`, rank
1 a `LearnerRank`, each in a process of its own with a rig of its own, filled alike) and compare with one learner in a
process of its own; the blame test runs two bare ranks under a real supervisor; the others run the trainer. The ranks
meet over gloo on the loopback.
"""

import contextlib
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import torch
from faster_fifo import Empty, Queue

from appo.config.cfg import make_config
from appo.learning.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint
from appo.learning.ppo import STATS
from appo.memory.control import LearnerArrays
from appo.memory.segments import unlink_segment
from appo.messages import WorkerFailed, WorkerReady
from appo.run.roles import Role
from appo.run.supervisor import Supervisor
from appo.utils.queues import make_queue
from tests.conftest import REPO, LearnerRig, final_reward, wait_for
from tests.test_faults import kill, stop, wait_for_log, worker_process

SMALL = ["--env=CartPole-v1", "--num_workers=2", "--num_envs_per_worker=8", "--report_interval=1", "--seed=1"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_iteration(exp_dir: str, rank: int, flags: list[str], out: str | None, drift: bool = False) -> None:
    """Rank `rank` of a learner group trains one iteration of policy 0 on a rig of its own (its trajectories the same
    as every rig's); rank 0 saves the model's weights and its statistics to `out`, a follower its weights to
    `out` + rank. One torch thread, as a learner process has. `drift`: the ranks compare their weights after every
    iteration, and rank 1's drift from rank 0's before it trains."""
    from appo.learning import ranks
    from appo.learning.learner_rank import LearnerRank

    torch.set_num_threads(1)
    if drift:
        ranks.WEIGHTS_CHECK_EVERY = 1

    rig = LearnerRig(exp_dir, "--ppo_epochs=2", "--adaptive_epochs=False", *flags)
    try:
        # One iteration's 4 trajectories (batch 32 = 4 x rollout 8): each step policy 0's or 1's, so every share of a
        # minibatch holds another count of policy 0's steps (the loss weights).
        slots = list(range(4))
        rig.traj.policy_ids[slots] = np.random.default_rng(1).integers(0, 2, size=(4, rig.cfg.rollout))
        rig.traj.policy_versions[slots] = 0
        if rank > 0:
            follower = LearnerRank(rig.ctx, 0, rank)
            follower.setup()
            if drift:
                with torch.no_grad():
                    next(follower.policy.model.parameters()).add_(1e-3)
            while not follower.stopped:
                follower.step(0.0)
            follower.close()
            torch.save(follower.policy.model.state_dict(), f"{out}{rank}")
            return
        rig.control.slot_owed[0][slots] = 1
        learner = rig.learner(0)
        before = {name: value.clone() for name, value in learner.policy.model.state_dict().items()}
        learner.train_iteration(learner.owed.pop(learner.trajs_per_iteration))
        assert learner.policy.version == 1 and learner.counters.samples == 32
        torch.save({"before": before, "after": learner.policy.model.state_dict(),
                    "stats": learner.counters.summary()}, out)
        learner.close()
    finally:
        for name in rig.names:
            unlink_segment(name)


def start_iteration(exp_dir: str, rank: int, flags: list[str], out: str, drift: bool = False) -> subprocess.Popen:
    """`one_iteration` in a fresh Python process (not a multiprocessing child: its spawn start method would leave a
    resource tracker process behind, which later tests of this session would count as this process's child)."""
    call = f"from tests.test_ranks import one_iteration; one_iteration(*{[exp_dir, rank, flags, out, drift]!r})"
    return subprocess.Popen([sys.executable, "-c", call], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("minibatches", [2, 4])  # 4: a trajectory per minibatch, so one rank's share is empty
def test_two_ranks_train_an_iteration_to_the_weights_and_statistics_one_process_trains(tmp_path, minibatches):
    # kl_adaptive: the KL from the iteration's starting weights is among the statistics.
    one = [f"--num_batches_per_iteration={minibatches}", "--lr_schedule=kl_adaptive"]
    # A pinned port: each process has shared memory of its own, where a picked port would not reach the other rank.
    two = [*one, "--learner_processes_per_policy=2", f"--learner_master_port={free_port()}"]
    processes = [start_iteration(str(tmp_path / "one"), 0, one, str(tmp_path / "one.pt")),
                 *(start_iteration(str(tmp_path / f"r{rank}"), rank, two, str(tmp_path / "two.pt")) for rank in (0, 1))]
    for process in processes:
        output, _ = process.communicate(timeout=150)
        assert process.returncode == 0, output[-3000:]
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["before"].keys() == two["after"].keys()
    for name, value in one["after"].items():
        torch.testing.assert_close(two["after"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(one["after"]["policy_head.weight"], one["before"]["policy_head.weight"])
    # Rank 0 reports the whole minibatches' statistics, though with 4 minibatches its share of each is empty.
    for name in (*STATS, "grad_norm"):
        assert two["stats"].get(name) == pytest.approx(one["stats"][name], rel=1e-4, abs=1e-6), name


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_weights_that_drift_apart_are_noticed_said_and_resynced_from_rank_0(tmp_path):
    two = ["--learner_processes_per_policy=2", f"--learner_master_port={free_port()}"]
    out = str(tmp_path / "two.pt")
    processes = [start_iteration(str(tmp_path / f"r{rank}"), rank, two, out, drift=True) for rank in (0, 1)]
    outputs = []
    for process in processes:
        outputs.append(process.communicate(timeout=150)[0])
        assert process.returncode == 0, outputs[-1][-3000:]
    (line,) = [line for line in outputs[0].splitlines() if "weights differ" in line]
    checksums = re.search(r"policy 0: the learner ranks' weights differ \(checksums by rank: (\S+), (\S+)\); rank 0's "
                          r"weights go to every rank with the next order", line)
    assert checksums and checksums[1] != checksums[2], line
    leader, follower = torch.load(out)["after"], torch.load(f"{out}1")
    for name, value in leader.items():  # the stop order brought rank 0's state
        assert torch.equal(follower[name], value), name


class GroupMember:
    """A bare rank of policy 0's learner group (the blame test below): it meets the group, says so in `joined` (and
    ready to the supervisor, if `ready`), then rank 0 waits in a barrier that the follower never reaches (it sleeps
    until it is killed)."""

    @classmethod
    def main(cls, cfg, learners: LearnerArrays, rank: int, joined: Queue, reports: Queue, ready: bool) -> None:
        from appo.learning.ranks import RankGroup

        group = RankGroup(cfg, learners, 0, rank, torch.device("cpu"))
        if ready:
            reports.put(WorkerReady(f"rank{rank}"))
        joined.put(rank)
        if rank == 0:
            group.barrier()
        time.sleep(3600)


def received(queue: Queue, messages: list) -> list:
    """`messages`, with what `queue` holds now added."""
    with contextlib.suppress(Empty):
        messages.extend(queue.get_many(timeout=0.1))
    return messages


def forget_port(cfg, learners: LearnerArrays, *_) -> None:
    """A `GroupMember`'s clean-up after its death, as appo/run/roles.forget_group_port does a learner rank's."""
    learners.group_port[0] = 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ready", [False, True])  # while the group starts; mid-run
def test_a_killed_follower_is_blamed_not_the_rank_whose_collective_failed_and_the_group_restarts(ready):
    """Rank 0's barrier fails once the follower is gone. The follower's death is the cause: it is counted, rank 0's is
    not, and neither stops the run, even before either was ready (a crash of its own before ready would). The new
    ranks meet on the new rank 0's port: the dead one's was cleared before either started."""
    cfg = make_config(env="CartPole-v1", learner_processes_per_policy=2)
    learners, joined, reports = LearnerArrays(1, 1), make_queue(), make_queue()
    supervisor = Supervisor(reports, max_restarts=3)
    role = Role("learner", lambda: GroupMember, forget_port)
    for rank in (0, 1):
        supervisor.add(f"rank{rank}", role, lambda rank=rank: (cfg, learners, rank, joined, reports, ready),
                       inbox=None, group="g")
    try:
        got: list[int] = []
        wait_for(lambda: len(received(joined, got)) == 2, 60, "both ranks in the group")
        first, port = supervisor.workers["rank0"].process.pid, int(learners.group_port[0])
        os.kill(supervisor.workers["rank1"].process.pid, signal.SIGKILL)
        supervisor.workers["rank0"].process.join(30)
        messages = reports.get_many(timeout=5)
        for name in [m.name for m in messages if isinstance(m, WorkerReady)]:
            supervisor.on_ready(name)
        (failure,) = [m for m in messages if isinstance(m, WorkerFailed)]
        assert failure.lost_peer and "rank 0: a barrier failed, another rank is gone or stuck" in failure.cause
        supervisor.on_failed(failure)
        assert [(d.worker.name, d.permanent) for d in supervisor.deaths()] == [("rank1", False), ("rank0", False)]
        assert supervisor.replace_dead([], lambda: None) is None
        assert supervisor.workers["rank0"].process.pid != first
        assert [w.total_restarts for w in supervisor.workers.values()] == [0, 1]
        wait_for(lambda: len(received(joined, got)) == 4, 60, "the new group")
        assert learners.group_port[0] not in (0, port)
    finally:
        for worker in supervisor.workers.values():
            worker.process.kill()
            worker.process.join()


def kill_while_joining(trainer_process, name: str) -> None:
    """SIGKILL worker `name` (a follower rank) as soon as it has a TCP connection, to its rank 0: while its group
    starts."""
    process = worker_process(trainer_process, name, timeout=60)
    wait_for(lambda: any(c.status == psutil.CONN_ESTABLISHED for c in process.net_connections("tcp")), 60,
             f"{name}'s connection to its rank 0", interval=0.005)
    os.kill(process.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_learn_cartpole_and_a_killed_follower_takes_its_group_down_and_back(trainer):
    """The follower killed while its group starts, then twice while it trains: each time the follower is named and
    counted, never rank 0 (whose collective fails when the follower goes), and the run goes on to learn."""
    process = trainer.start(*SMALL, "--experiment=ranks", "--learner_processes_per_policy=2",
                            "--train_for_env_steps=150000")
    log = pathlib.Path(trainer.train_dir, "ranks", "log.txt")
    died = r"learner_p0_r1 died \(killed by SIGKILL\); replaced it and the rest of its group \(learner_p0\)"
    def version() -> int:
        return max(map(int, re.findall(r"p0: v(\d+)", log.read_text())), default=0)

    try:
        kill_while_joining(process, "learner_p0_r1")
        wait_for_log(log, died, 60)
        for kills in (2, 3):
            wait_for_log(log, r"policy 0: 2 learner ranks on the CPU \(\d+ cores", 60, count=kills - 1)
            trained = version()
            wait_for(lambda trained=trained: version() >= trained + 5, 60, "5 versions trained by both ranks")
            kill(process, "learner_p0_r1")
            wait_for_log(log, died, 20, count=kills)
        output, _ = process.communicate(timeout=200)
    finally:
        stop(process)
    assert process.returncode == 0, output[-3000:]
    assert "Stopped: reached --train_for_env_steps=150000" in output
    assert final_reward(trainer.train_dir, "ranks") > 200
    text = log.read_text()
    assert re.search(r"learner replaced; continues as version \d+ from the weights it published last", text)
    assert "restarts: learner_rank 3" in output and "learner 1" not in output
    assert "learner_p0 died" not in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_runs_with_ranks_at_once_each_meet_on_a_port_of_their_own_and_learn(trainer):
    """Default flags in both: each group's rank 0 listens on a free port of its own and publishes it to its ranks."""
    runs = {name: trainer.start(*SMALL, f"--experiment={name}", "--learner_processes_per_policy=2",
                                "--train_for_env_steps=60000") for name in ("first", "second")}
    try:
        outputs = {name: process.communicate(timeout=240)[0] for name, process in runs.items()}
    finally:
        for process in runs.values():
            stop(process)
    ports = set()
    for name, process in runs.items():
        assert process.returncode == 0, outputs[name][-3000:]
        assert "Stopped: reached --train_for_env_steps=60000" in outputs[name]
        assert final_reward(trainer.train_dir, name) > 60
        ports.update(re.findall(r"2 learner ranks on the CPU .*, meeting on port (\d+)", outputs[name]))
    assert len(ports) == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_checkpoint_written_by_two_ranks_resumes_with_one_and_the_reverse(trainer):
    versions = []
    for ranks, steps in ((2, 20000), (1, 40000), (2, 60000)):
        result = trainer.run(*SMALL, "--experiment=resume", f"--learner_processes_per_policy={ranks}",
                             f"--train_for_env_steps={steps}", timeout=120)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        state = load_checkpoint(latest_checkpoint(checkpoint_dir(str(pathlib.Path(trainer.train_dir, "resume")), 0)),
                                "cpu")
        assert state["env_steps"] >= steps
        versions.append(state["version"])
        if len(versions) > 1:
            assert "policy 0: resumed from" in result.stdout + result.stderr
    assert versions == sorted(versions) and len(set(versions)) == 3


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--serial_mode=True"], "--learner_processes_per_policy=2: each rank is a process of its own, which "
                             "--serial_mode=True does not start; use 1 in serial mode"),
    (["--with_vtrace=True"], "--with_vtrace=True computes them per minibatch: use 1 with it"),
])
def test_what_ranks_cannot_do_is_refused_in_one_line(trainer, flags, message):
    result = trainer.run("--env=CartPole-v1", "--experiment=refused", "--learner_processes_per_policy=2", *flags,
                         timeout=60)
    assert result.returncode == 2 and message in result.stderr
    assert not pathlib.Path(trainer.train_dir, "refused").exists()


@pytest.mark.slow
def test_a_rendezvous_port_in_use_is_refused_in_one_line(trainer):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = trainer.run("--env=CartPole-v1", "--experiment=refused", "--learner_processes_per_policy=2",
                             "--num_policies=2", f"--learner_master_port={port - 1}", timeout=60)
    assert result.returncode == 2
    assert (f"--learner_master_port={port - 1}: port {port} of 127.0.0.1, where policy 1's learner ranks meet, is "
            "taken") in result.stderr
    assert not pathlib.Path(trainer.train_dir, "refused").exists()


def test_more_ranks_than_gpus_is_refused_in_one_line(monkeypatch):
    """This machine has no GPU: the count the check reads is set (appo/preflight.py asks a child process for it)."""
    from appo import preflight
    from appo.config.cfg import ConfigError, make_config

    monkeypatch.setattr(preflight, "cuda_device_count", lambda: 1)
    cfg = make_config(env="CartPole-v1", learner_processes_per_policy=2, learner_master_port=free_port(),
                      device="cuda")
    with pytest.raises(ConfigError, match=r"^--learner_processes_per_policy=2: each rank on CUDA needs a GPU of its "
                                          r"own and 1 are visible; use at most 1, or --device=cpu$"):
        preflight.check_rank_gpus_and_ports(cfg)
    preflight.check_rank_gpus_and_ports(make_config(env="CartPole-v1", learner_processes_per_policy=2,
                                              learner_master_port=free_port(), device="cpu"))
