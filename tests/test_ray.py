"""--backend=ray on a real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster), and the slot hand-over
the cluster process and the nodes share with actors and learners.

Every node of the cluster is a set of processes on this machine at its own address, so no packet leaves it (Linux
routes a machine's traffic to itself over the loopback device). Ray 2.60 cannot form a cluster on 127.0.0.1 itself:
a driver joining it waits forever for the head's pubsub.
"""

import pathlib
import re
import time

import numpy as np
import psutil
import pytest
from ray.cluster_utils import Cluster

from appo.memory.buffers import Layout
from appo.memory.control import SharedControl
from appo.memory.slots import hand_over_slots, release_slots
from appo.messages import WAKE
from appo.run.ray_backend import plan_groups
from appo.utils.queues import make_queue
from tests.conftest import final_reward, processes_mentioning, shm_entries, wait_for

RAY_PROCESSES = ("raylet", "gcs_server", "plasma_store", "ray::", "default_worker.py", "log_monitor.py",
                 "dashboard", "monitor.py", "runtime_env_agent")


def ray_processes() -> list[str]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            text = " ".join([proc.info["name"] or "", *(proc.info["cmdline"] or [])])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(marker in text for marker in RAY_PROCESSES):
            found.append(text[:120])
    return found


def test_groups_split_the_workers():
    assert plan_groups(4, [2.0, 2.0], 0) == [(0, 2), (2, 2)]
    assert plan_groups(5, [2.0, 2.0], 0) == [(0, 3), (3, 2)]
    assert plan_groups(5, [8.0], 2) == [(0, 2), (2, 2), (4, 1)]
    assert plan_groups(1, [1.0, 1.0, 1.0], 0) == [(0, 1)]


def test_slots_handed_over_are_owed_and_hinted_and_a_release_clears_only_what_was_read():
    """The head's cluster process hands slots over as an actor does; a node's pull releases what it copied, as a
    learner does: the flags it read are cleared, another policy's raised since stays, each owner is woken once."""
    layout = Layout(num_workers=2, num_splits=1, num_agents=1, agents_per_split=2, rollout=4, slots_per_worker=3,
                    obs={"obs": ((1,), np.dtype(np.float32))}, action_shape=(), action_dtype=np.dtype(np.int64),
                    rnn_size=1)
    control = SharedControl(layout, num_policies=2)
    learner_inboxes, actor_inboxes = [make_queue() for _ in range(2)], [make_queue() for _ in range(2)]
    hand_over_slots(control, learner_inboxes, 1, [0, 1, 4])
    assert control.slot_owed.tolist() == [[0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 1, 0]]
    assert learner_inboxes[1].get_many(timeout=1) == [[0, 1, 4]]
    read = np.array([0, 1, 4])
    policies, columns = np.nonzero(control.slot_owed[:, read])
    hand_over_slots(control, learner_inboxes, 0, [4])  # raised after the read
    release_slots(control, layout, actor_inboxes, policies, read[columns])
    assert control.slot_owed.tolist() == [[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]]
    assert actor_inboxes[0].get_many(timeout=1) == [WAKE] and actor_inboxes[1].get_many(timeout=1) == [WAKE]
    release_slots(control, layout, actor_inboxes, 0, [4])  # a learner's release
    assert control.slot_owed.sum() == 0 and actor_inboxes[1].get_many(timeout=1) == [WAKE]


def read_until(process, lines: list[str], pattern: str, deadline: float, at_least: int = 0) -> re.Match:
    """Read the run's output (kept in `lines`) until a line matches (with a first group >= at_least, if given);
    fail with the output at the deadline."""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(pattern, line)
        if match and (not at_least or int(match.group(1)) >= at_least):
            return match
    pytest.fail(f"no line matching {pattern!r}; output:\n{''.join(lines[-60:])}")


@pytest.mark.slow
@pytest.mark.timeout(600)  # 172 s on 2 cores alone (2026-11-26); CI's machines are slower
def test_cartpole_learns_on_two_nodes_and_survives_losing_one(trainer):
    """A head without CPUs and two nodes of one CPU: one sampler group per node. One node is removed mid-run:
    the run logs it, goes on with the other group, replaces the lost one on a node added later, and learns."""
    shm_before = shm_entries()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    lines: list[str] = []
    process = None
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        process = trainer.start("--env=CartPole-v1", "--experiment=ray", "--backend=ray",
                                f"--ray_address={cluster.address}", "--num_workers=2", "--num_envs_per_worker=8",
                                "--train_for_env_steps=500000", "--report_interval=1")
        deadline = time.monotonic() + 240
        read_until(process, lines, r"2 sampler groups of 1/1 actor workers", deadline)
        for _ in range(2):
            read_until(process, lines, r"sampler group n\d \(actor worker \d\) runs on node", deadline)
        steps = int(read_until(process, lines, r"env steps (\d+)", deadline, at_least=100_000).group(1))
        # The groups and the actors they fork never load torch (only the head's learners do).
        names = {p.pid: p.name() for p in processes_mentioning("ray::NodeSampler")}  # forks keep the title
        assert sorted(names.values()).count("actor_0") == 2 and len(names) == 6, names  # + group, inference
        with_torch = [name for pid, name in names.items()
                      if "libtorch" in pathlib.Path(f"/proc/{pid}/maps").read_text()]
        assert with_torch == ["inference_0", "inference_0"], names
        cluster.remove_node(nodes[1], allow_graceful=False)
        lost = read_until(process, lines, r"sampler group (n\d) on node \S+ lost", deadline)
        assert "training goes on with 1 of 2 actor workers" in lines[-1]
        # The other group keeps sampling while no node has a CPU for the replacement.
        read_until(process, lines, r"env steps (\d+)", deadline, at_least=steps + 50_000)
        assert "replaced on node" not in "".join(lines)
        cluster.add_node(num_cpus=1)
        read_until(process, lines, rf"sampler group {lost.group(1)} \(actor worker \d\) replaced on node",
                   deadline)
        read_until(process, lines, r"Summary:", deadline)
        lines += process.stdout.readlines()
        assert process.wait(timeout=30) == 0, "".join(lines[-60:])
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        cluster.shutdown()
    output = "".join(lines)
    env_steps = [int(n) for n in re.findall(r"env steps (\d+)", output)]
    assert env_steps == sorted(env_steps) and env_steps[-1] >= 500_000
    assert re.search(r"restarts: sampler group [1-9]", output), output[-3000:]
    # Random play scores about 22.
    assert final_reward(trainer.train_dir, "ray") > 300, output[-3000:]
    trainer.assert_no_leftovers(shm_before)
    wait_for(lambda: not ray_processes(), 10, "end of Ray's processes", interval=0.2,
             details=lambda: str(ray_processes()))
    assert np.all([not name.startswith(("appo_", "plasma")) for name in shm_entries() - shm_before])
