"""The learner in-process (no processes): how many passes an iteration trains."""

import pytest

from appo.memory.segments import unlink_segment
from tests.conftest import LearnerRig


@pytest.fixture
def rig(tmp_path, request):
    rig = LearnerRig(str(tmp_path), "--ppo_epochs=4", *getattr(request, "param", ()))
    yield rig
    for name in rig.names:
        unlink_segment(name)


def train_once(rig: LearnerRig, next_iteration_in: bool) -> tuple[float, int]:
    """Train one iteration of policy 0, with or without the next iteration's trajectories already owed to it; returns
    the passes trained and the updates applied."""
    learner = rig.learner(0)
    per_iteration = learner.trajs_per_iteration
    slots, following = list(range(per_iteration)), list(range(per_iteration, 2 * per_iteration))
    rig.traj.policy_ids[slots + following] = 0
    rig.traj.policy_versions[slots + following] = 0
    rig.control.slot_owed[0][slots] = 1
    rig.control.slot_owed[0][following] = int(next_iteration_in)
    learner.train_iteration(slots)
    return learner.counters.stats["epochs"][-1], learner.policy.train_steps


def test_with_time_to_spare_every_pass_is_trained(rig):
    assert train_once(rig, next_iteration_in=False) == (4.0, 4)


def test_once_the_next_iteration_is_in_the_learner_stops_after_the_first_pass(rig):
    assert train_once(rig, next_iteration_in=True) == (1.0, 1)


@pytest.mark.parametrize("rig", [("--adaptive_epochs=False",)], indirect=True)
def test_without_adaptive_epochs_every_pass_is_trained(rig):
    assert train_once(rig, next_iteration_in=True) == (4.0, 4)
