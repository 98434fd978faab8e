"""The learner in-process (no processes): how many passes an iteration trains, and when it waits."""

import time

import pytest
import torch

from appo.config.flags import KL_ADAPTIVE_RANGE
from appo.learning.policy import Policy, kl_adapted_factor, scheduled_learning_rate
from appo.memory.segments import unlink_segment
from tests.conftest import LearnerRig


@pytest.fixture
def rig(tmp_path, request):
    rig = LearnerRig(str(tmp_path), "--ppo_epochs=4", *getattr(request, "param", ()))
    yield rig
    for name in rig.names:
        unlink_segment(name)


def train_once(rig: LearnerRig, next_iteration_in: bool, env_steps: int = 0):
    """Train one iteration of a new learner of policy 0 (whose policy took `env_steps` so far), with or without the
    next iteration's trajectories already owed to it; returns the learner."""
    learner = rig.learner(0)
    learner.policy.env_steps = env_steps
    per_iteration = learner.trajs_per_iteration
    slots, following = list(range(per_iteration)), list(range(per_iteration, 2 * per_iteration))
    rig.traj.policy_ids[slots + following] = 0
    rig.traj.policy_versions[slots + following] = 0
    rig.control.slot_owed[0][slots] = 1
    rig.control.slot_owed[0][following] = int(next_iteration_in)
    learner.train_iteration(slots)
    return learner


def passes_and_updates(learner) -> tuple[float, int]:
    return learner.counters.stats["epochs"][-1], learner.policy.train_steps


@pytest.mark.parametrize("rig", [("--adaptive_epochs=True",)], indirect=True)
def test_adaptive_with_time_to_spare_every_pass_is_trained(rig):
    assert passes_and_updates(train_once(rig, next_iteration_in=False)) == (4.0, 4)


@pytest.mark.parametrize("rig", [("--adaptive_epochs=True",)], indirect=True)
def test_adaptive_once_the_next_iteration_is_in_the_learner_stops_after_the_first_pass(rig):
    assert passes_and_updates(train_once(rig, next_iteration_in=True)) == (1.0, 1)


@pytest.mark.parametrize("next_iteration_in", [False, True])
def test_by_default_every_pass_is_trained_however_fast_the_sampler(rig, next_iteration_in):
    """The passes are a learning value: the same on a machine whose sampler is ahead of the learner as on one where
    it is behind."""
    assert passes_and_updates(train_once(rig, next_iteration_in=next_iteration_in)) == (4.0, 4)


@pytest.mark.parametrize("rig", [("--minibatch_unit=step", "--num_batches_per_iteration=8", "--batch_size=8")],
                         indirect=True)
def test_passes_over_single_steps_count_as_passes_when_fewer_trajectories_than_minibatches_arrive(rig):
    """An iteration left with 4 of its 8 trajectories (the others too old, say) still draws 8 minibatches of single
    steps a pass: 4 passes of 8 updates, whatever the trajectories' count."""
    learner = rig.learner(0)
    slots = list(range(4))
    rig.traj.policy_ids[slots] = 0
    rig.traj.policy_versions[slots] = 0
    rig.control.slot_owed[0][slots] = 1
    learner.train_iteration(slots)
    assert passes_and_updates(learner) == (4.0, 32)


def test_the_linear_schedule_decays_the_learning_rate_to_zero_at_the_budget():
    assert scheduled_learning_rate(1e-3, "constant", 900, 1000) == 1e-3
    assert [scheduled_learning_rate(1e-3, "linear", steps, 1000) for steps in (0, 250, 1000, 1200)] == pytest.approx(
        [1e-3, 7.5e-4, 0.0, 0.0])


@pytest.mark.parametrize("rig", [("--lr_schedule=linear", "--train_for_env_steps=1000", "--learning_rate=0.002")],
                         indirect=True)
def test_each_iteration_trains_at_the_scheduled_learning_rate(rig):
    batch_steps = 4 * rig.cfg.rollout  # the rig's 4 envs of one worker: one iteration of 32 samples
    learner = train_once(rig, next_iteration_in=False, env_steps=500 - batch_steps)
    assert learner.policy.env_steps == 500
    assert learner.policy.optimizer.param_groups[0]["lr"] == pytest.approx(0.001)


def test_the_kl_adaptive_factor_moves_against_the_kl_within_its_range():
    assert kl_adapted_factor(1.0, 0.03, 0.01) == pytest.approx(1 / 1.5)  # over twice the threshold
    assert kl_adapted_factor(0.5, 0.004, 0.01) == pytest.approx(0.75)  # under half
    assert kl_adapted_factor(0.5, 0.01, 0.01) == 0.5
    assert kl_adapted_factor(0.5, 0.02, 0.01) == kl_adapted_factor(0.5, 0.005, 0.01) == 0.5  # the band's edges
    low, high = KL_ADAPTIVE_RANGE
    assert kl_adapted_factor(low, 1.0, 0.01) == low and kl_adapted_factor(high, 0.0, 0.01) == high
    assert high == 1.0  # --learning_rate is the most it reaches


def kl_adaptive(threshold: str) -> tuple[str, ...]:
    return "--lr_schedule=kl_adaptive", "--learning_rate=0.002", f"--lr_schedule_kl_threshold={threshold}"


@pytest.mark.parametrize("rig, factor", [(kl_adaptive("1e-12"), 1 / 1.5), (kl_adaptive("100"), 1.0)],
                         indirect=["rig"])
def test_with_kl_adaptive_the_next_iteration_trains_at_a_rate_moved_by_this_ones_kl(rig, factor):
    """An iteration that moved the policy more than the threshold allows lowers the rate; one that barely moved it
    leaves it at --learning_rate, the ceiling. The factor is saved with the policy, so a resumed run goes on at the
    rate it had reached."""
    learner = train_once(rig, next_iteration_in=False)
    assert learner.counters.last_kl > 0.0
    learner.policy.apply_learning_rate()
    assert learner.policy.optimizer.param_groups[0]["lr"] == pytest.approx(0.002 * factor)
    resumed = Policy(0, rig.cfg, rig.spaces, torch.device("cpu"))
    resumed.load_state_dict(learner.policy.state_dict())
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.002 * factor)


def test_without_kl_adaptive_the_kl_leaves_the_rate_alone(rig):
    learner = train_once(rig, next_iteration_in=False)
    learner.policy.apply_learning_rate()
    assert learner.policy.lr_factor == 1.0
    assert learner.policy.optimizer.param_groups[0]["lr"] == pytest.approx(rig.cfg.learning_rate)


def queue_trajectories(rig: LearnerRig, learner, count: int) -> None:
    """`count` fresh trajectories of policy 0 owed to `learner` and queued, as the actors' hints would queue them."""
    slots = list(range(count))
    rig.traj.policy_ids[slots] = 0
    rig.traj.policy_versions[slots] = 0
    rig.control.slot_owed[0][slots] = 1
    learner.on_message(slots)


def test_with_an_iteration_queued_the_learner_trains_without_waiting_on_its_empty_inbox(rig):
    """Actors paused for the backlog send nothing: a learner that waited on its inbox first would idle both sides for
    the whole timeout before each iteration (a quarter of a connect four run's learner time)."""
    learner = rig.learner(0)
    queue_trajectories(rig, learner, learner.backlog_limit + 1)
    started = time.monotonic()
    learner.step(timeout=60.0)
    assert learner.policy.version == 1
    assert time.monotonic() - started < 30.0  # an iteration of 32 samples; a wait would take the 60 s



def test_rows_gathered_through_kept_host_buffers_are_the_indexed_rows_and_the_buffers_are_reused():
    """`DeviceCopies`'s GPU path (each field gathered into a host buffer kept from batch to batch, pinned on CUDA,
    then copied without waiting), run on the CPU with unpinned buffers: the rows are those indexed, of every
    observation key, a smaller batch reuses a buffer and a larger one grows it. A CPU learner indexes directly."""
    from appo.learning.batching import DeviceCopies

    assert not DeviceCopies(torch.device("cpu")).staged
    copies = DeviceCopies(torch.device("cpu"), staged=True)
    values = torch.randn(10, 6)
    obs = {"pixels": torch.randint(0, 255, (10, 3, 2), dtype=torch.uint8), "vector": torch.randn(10, 3)}
    index = torch.tensor([3, 1, 7])
    assert torch.equal(copies.rows("values", values, index), values[index])
    rows = copies.rows("obs", obs, index)
    assert all(torch.equal(rows[key], obs[key][index]) for key in obs) and rows["pixels"].dtype == torch.uint8
    kept = copies.buffers["values"].data_ptr()
    assert torch.equal(copies.rows("values", values, torch.tensor([9])), values[[9]])
    assert copies.buffers["values"].data_ptr() == kept
    every = torch.arange(10).flip(0)
    assert torch.equal(copies.rows("values", values, every), values[every]) and len(copies.buffers["values"]) == 10
    copies.sent()
    copies.wait()  # nothing to wait for on a CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pinned path runs on CUDA (scripts/gpu_check.py)")
def test_on_cuda_rows_go_through_pinned_buffers_and_each_batch_is_its_own():
    from appo.learning.batching import DeviceCopies

    copies = DeviceCopies(torch.device("cuda"))
    values = torch.randn(64, 5)
    first = copies.rows("values", values, torch.arange(32))
    copies.sent()
    copies.wait()
    second = copies.rows("values", values, torch.arange(32, 64))
    copies.sent()
    assert copies.staged and copies.buffers["values"].is_pinned()
    assert torch.equal(first.cpu(), values[:32]) and torch.equal(second.cpu(), values[32:])
