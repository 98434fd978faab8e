"""--learner_processes_per_policy: several learner processes (ranks) train one policy (appo/learning/ranks.py).

The equivalence test runs real learners over the shared buffers of a `LearnerRig` (rank 0 a `Learner`, rank 1 a
`LearnerRank`, each in a process of its own with a rig of its own, filled alike) and compares with one learner in a
process of its own; the others run the trainer. The ranks meet over gloo on the loopback.
"""

import json
import pathlib
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from appo.learning.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint
from appo.memory.segments import unlink_segment
from tests.conftest import REPO, LearnerRig, final_reward
from tests.test_faults import kill, stop, wait_for_log

SMALL = ["--env=CartPole-v1", "--num_workers=2", "--num_envs_per_worker=8", "--report_interval=1", "--seed=1"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_iteration(exp_dir: str, rank: int, flags: list[str], out: str | None) -> None:
    """Rank `rank` of a learner group trains one iteration of policy 0 on a rig of its own (its trajectories the same
    as every rig's); rank 0 saves the model's weights to `out`. One torch thread, as a learner process has."""
    from appo.learning.learner_rank import LearnerRank

    torch.set_num_threads(1)

    rig = LearnerRig(exp_dir, "--ppo_epochs=2", "--adaptive_epochs=False", *flags)
    try:
        # One iteration's 4 trajectories (batch 32 = 4 x rollout 8): each step policy 0's or 1's, so every share of a
        # minibatch holds another count of policy 0's steps (the loss weights).
        slots = list(range(4))
        rig.traj.policy_ids[slots] = np.random.default_rng(1).integers(0, 2, size=(4, rig.cfg.rollout))
        rig.traj.policy_versions[slots] = 0
        if rank > 0:
            LearnerRank(rig.ctx, 0, rank).run()
            return
        rig.control.slot_owed[0][slots] = 1
        learner = rig.learner(0)
        before = {name: value.clone() for name, value in learner.policy.model.state_dict().items()}
        learner.train_iteration(learner.owed.pop(learner.trajs_per_iteration))
        assert learner.policy.version == 1 and learner.counters.samples == 32
        torch.save({"before": before, "after": learner.policy.model.state_dict()}, out)
        learner.close()
    finally:
        for name in rig.names:
            unlink_segment(name)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("minibatches", [2, 4])  # 4: a trajectory per minibatch, so one rank's share is empty
def test_two_ranks_train_an_iteration_to_the_weights_one_process_trains(tmp_path, minibatches):
    def start(exp_dir: str, rank: int, flags: list[str], out: str) -> subprocess.Popen:
        """`one_iteration` in a fresh Python process (not a multiprocessing child: its spawn start method would leave a
        resource tracker process behind, which later tests of this session would count as this process's child)."""
        call = f"from tests.test_ranks import one_iteration; one_iteration(*{json.dumps([exp_dir, rank, flags, out])})"
        return subprocess.Popen([sys.executable, "-c", call], cwd=REPO)

    one = [f"--num_batches_per_iteration={minibatches}"]
    two = [*one, "--learner_processes_per_policy=2", f"--learner_master_port={free_port()}"]
    processes = [start(str(tmp_path / "one"), 0, one, str(tmp_path / "one.pt")),
                 *(start(str(tmp_path / f"r{rank}"), rank, two, str(tmp_path / "two.pt")) for rank in (0, 1))]
    for process in processes:
        assert process.wait(timeout=150) == 0
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["before"].keys() == two["after"].keys()
    for name, value in one["after"].items():
        torch.testing.assert_close(two["after"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(one["after"]["policy_head.weight"], one["before"]["policy_head.weight"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_learn_cartpole_and_a_killed_rank_takes_its_group_down_and_back(trainer):
    process = trainer.start(*SMALL, "--experiment=ranks", "--learner_processes_per_policy=2",
                            f"--learner_master_port={free_port()}", "--train_for_env_steps=150000")
    log = pathlib.Path(trainer.train_dir, "ranks", "log.txt")
    try:
        wait_for_log(log, r"policy 0: 2 learner ranks on the CPU \(\d+ cores", 60)
        wait_for_log(log, r"p0: v[1-9]\d, reward", 60)  # ten iterations trained by both ranks
        kill(process, "learner_p0_r1")
        wait_for_log(log, r"learner_p0_r1 died \(killed by SIGKILL\); replaced it and the rest of its group "
                          r"\(learner_p0\)", 20)
        wait_for_log(log, r"policy 0: 2 learner ranks on the CPU", 60, count=2)
        output, _ = process.communicate(timeout=180)
    finally:
        stop(process)
    assert process.returncode == 0, output[-3000:]
    assert "Stopped: reached --train_for_env_steps=150000" in output
    assert final_reward(trainer.train_dir, "ranks") > 200
    text = log.read_text()
    assert re.search(r"learner replaced; continues as version \d+ from the weights it published last", text)
    assert "restarts: learner_rank 1" in output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_checkpoint_written_by_two_ranks_resumes_with_one_and_the_reverse(trainer):
    port = f"--learner_master_port={free_port()}"
    versions = []
    for ranks, steps in ((2, 20000), (1, 40000), (2, 60000)):
        result = trainer.run(*SMALL, "--experiment=resume", f"--learner_processes_per_policy={ranks}", port,
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
