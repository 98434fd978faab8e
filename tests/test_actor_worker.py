"""The actor worker's stepping and slot handling, driven directly with real envs, buffers and queues.

`answer` plays the inference worker: it bumps a split's answer counter, as inference does after
writing the actions."""

import contextlib
import threading
import time

import pytest
from faster_fifo import Empty, Queue

from appo.config.cfg import build_parser, env_kwargs, resolve
from appo.memory.buffers import TRUNCATED, Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.sampling.actor_worker import ActorWorker
from envs import make_env
from envs.registry import reward_shaping


def make_worker(*env_args: str, shaping: list[list[float]] | None = None):
    """An actor over real envs and buffers; `shaping[p]`: policy p's reward-shaping coefficients."""
    cfg = resolve(build_parser().parse_args([*(env_args or ["--env=CartPole-v1"]), "--num_workers=1",
                                             "--num_envs_per_worker=4", "--worker_num_splits=2", "--rollout=4",
                                             "--batch_size=16", "--decorrelate_envs_on_one_worker=False"]))
    env = make_env(cfg.env, env_kwargs(cfg))
    layout = Layout.from_cfg(cfg, env.observation_space, env.action_space)
    queues = {"inbox": Queue(), "inference": Queue(), "report": Queue()}
    learners = [Queue() for _ in range(cfg.num_policies)]
    control = SharedControl(layout, cfg.num_policies, shaping_keys=tuple(reward_shaping(env)[0]))
    if shaping is not None:
        control.runner.reward_shaping[:] = shaping
    worker = ActorWorker(cfg, layout, 0, TrajBuffers(layout), control, queues["inbox"], [[queues["inference"]]],
                         learners, queues["report"])
    queues["learner"] = learners[0]
    worker.init_envs()
    for s in range(layout.num_splits):
        worker._request_actions(s)
    return worker, layout, queues


def answer(worker, s: int) -> None:
    """Every policy asked by split s has answered (with the zero actions in the buffers)."""
    worker.control.inference.answer_count[:, worker.worker, s] = worker.control.actors.request_count[:, worker.worker, s]


@pytest.mark.timeout(30)
def test_a_rollout_end_takes_slots_no_learner_owes_a_read():
    """The slots a learner still owes a read are not reused; once it clears them, the ending split takes them."""
    worker, layout, queues = make_worker()
    spare = worker._free_slots() + layout.worker_slots(0).start
    worker.control.slot_owed[0, spare] = 1  # every spare slot is at the learner
    split = worker.splits[0]
    split.t = layout.rollout - 1
    before = worker.control.actors.cur_slot[0, 0].copy()
    released = spare[:len(before)]
    worker.control.slot_owed[0, released] = 0  # the learner has read these (and sends a wake-up)
    queues["inbox"].put(("released",))

    answer(worker, 0)
    worker._step_split(0)

    assert split.t == 0 and not worker._answered(0)  # waits for the answer to its new request
    assert sorted(worker.control.actors.cur_slot[0, 0].tolist()) == sorted(released.tolist())
    assert worker.control.slot_owed[0, before].all()  # the filled slots are owed to the learner now
    kind, sent = queues["learner"].get(timeout=1)
    assert kind == "traj" and sorted(sent) == sorted(before.tolist())
    assert worker.control.actors.request_step[0, 0, 0] == 0


@pytest.mark.timeout(30)
def test_a_replacement_worker_never_takes_a_slot_a_learner_owes_a_read():
    """An actor started after a crash (same buffers) leaves alone the slots its predecessor sent to a learner."""
    worker, layout, queues = make_worker()
    owed = worker.control.slot_owed[0]
    sent = worker._free_slots()[:3] + layout.worker_slots(0).start
    owed[sent] = 1
    replacement = ActorWorker(worker.cfg, layout, 0, worker.traj, worker.control, queues["inbox"],
                              [[queues["inference"]]], [queues["learner"]], queues["report"])
    replacement.init_envs()
    in_use = worker.control.actors.cur_slot[0].ravel()
    assert set(in_use.tolist()).isdisjoint(sent.tolist())
    assert owed[sent].all()


@pytest.mark.timeout(30)
def test_a_replacement_waits_for_slots_when_learners_owe_nearly_all_of_them():
    """Its predecessor died while the learners were behind: one split's worth of slots is free, not two."""
    worker, layout, queues = make_worker()
    owed = worker.control.slot_owed[0]
    slots = list(layout.worker_slots(0))
    owed[slots[layout.agents_per_split:]] = 1
    later = slots[-layout.agents_per_split:]

    def learner_catches_up():
        time.sleep(0.3)
        owed[later] = 0
        queues["inbox"].put(("released",))

    catching_up = threading.Thread(target=learner_catches_up)
    catching_up.start()
    replacement = ActorWorker(worker.cfg, layout, 0, worker.traj, worker.control, queues["inbox"],
                              [[queues["inference"]]], [queues["learner"]], queues["report"])
    replacement.init_envs()
    catching_up.join()
    in_use = sorted(worker.control.actors.cur_slot[0].ravel().tolist())
    assert in_use == sorted(slots[:layout.agents_per_split] + later)


@pytest.mark.timeout(30)
def test_a_non_finite_reward_is_stored_as_zero_logged_once_and_counted(caplog):
    worker, layout, queues = make_worker()
    slots = worker.control.actors.cur_slot[0, 0].copy()
    env = worker.splits[0].envs[1]
    env.unwrapped.step = lambda action: (env.unwrapped.state, float("nan"), False, False, {})
    for _ in range(2):
        answer(worker, 0)
        worker._step_split(0)
    assert worker.traj.rewards[slots[1], :2].tolist() == [0.0, 0.0]
    assert worker.nonfinite_rewards == 2 and worker.splits[0].episode_reward[1] == 0.0
    warnings = [r for r in caplog.records if "non-finite reward" in r.getMessage()]
    assert len(warnings) == 1 and "env 1 of split 0" in warnings[0].getMessage()


@pytest.mark.timeout(30)
def test_requests_wake_an_idle_inference_worker_only():
    worker, layout, queues = make_worker()
    answer(worker, 0)
    worker._step_split(0)  # inference busy: no message
    worker.control.inference.idle[0, 0] = 1
    answer(worker, 1)
    worker._step_split(1)  # inference asleep: one wake-up
    assert queues["inference"].get_many(timeout=1) == [("wake",)]
    assert list(worker.control.actors.request_count[0, 0]) == [2, 2]


@pytest.mark.timeout(30)
def test_a_step_writes_rewards_dones_and_next_observations():
    worker, layout, queues = make_worker()
    slots = worker.control.actors.cur_slot[0, 1].copy()
    worker.traj.actions[slots, 0] = 1
    answer(worker, 1)
    worker._step_split(1)
    assert (worker.traj.rewards[slots, 0] == 1.0).all()  # CartPole's reward, unscaled (the learner scales it)
    assert not worker.traj.dones[slots, 0].any()
    assert (worker.traj.obs["obs"][slots, 1] != worker.traj.obs["obs"][slots, 0]).any()
    assert worker.splits[1].t == 1 and worker.env_steps == 2


@pytest.mark.timeout(30)
def test_a_time_limit_is_stored_as_truncation_and_the_episode_is_reported():
    # Synthetic episodes of 2 steps, ended by a time limit; rewards are 0 or 1.
    worker, layout, queues = make_worker("--env=sleep_env", '--env_kwargs={"step_seconds": 0, "episode_len": 2}')
    split = worker.splits[0]
    slots = split.slots.copy()
    for _ in range(2):
        answer(worker, 0)
        worker._step_split(0)
    assert (worker.traj.dones[slots, 0] == 0).all() and (worker.traj.dones[slots, 1] == TRUNCATED).all()
    assert len(worker.finished_episodes) == 2  # the split's two envs
    for policy, reward, length, objective, extra in worker.finished_episodes:
        assert policy == 0 and length == 2 and extra == {}
        assert objective == reward  # PBT's default objective: the return, when the env reports no true_objective
    rewards = worker.traj.rewards[slots, :2].sum(axis=1)
    assert sorted(r for _, r, _, _, _ in worker.finished_episodes) == sorted(rewards.tolist())


@pytest.mark.timeout(30)
def test_envs_play_with_their_policys_shaping_and_report_the_true_objective():
    pbt = ["--env=mountain_car_shaped", "--num_policies=2", "--with_pbt=True", "--agent_policy_mapping=episode"]
    worker, layout, queues = make_worker(*pbt, shaping=[[0.25], [0.75]])
    def shaping_of_envs():
        return [(int(worker.control.actors.agent_policy[0, s, i]), env.get_wrapper_attr("get_reward_shaping")())
                for s, split in enumerate(worker.splits) for i, env in enumerate(split.envs)]
    assert all(scheme == {"velocity_bonus": [0.25, 0.75][p]} for p, scheme in shaping_of_envs())

    worker.control.runner.reward_shaping[1] = [2.0]  # PBT moved policy 1's coefficient: envs take it at episode start
    for _ in range(200):  # MountainCar's time limit; action 0 (push left) never reaches the goal
        for s in range(layout.num_splits):
            answer(worker, s)
            worker._step_split(s)
            for p, learner in enumerate(worker.learner_inboxes):  # the learners read the trajectories
                with contextlib.suppress(Empty):
                    for _, slots in learner.get_many(block=False):
                        worker.control.slot_owed[p, slots] = 0
    assert len(worker.finished_episodes) == 4
    for _, reward, length, objective, extra in worker.finished_episodes:
        assert length == 200 and objective == 0.0  # the goal was not reached, whatever the shaped return
        assert extra["true_objective"] == 0.0 and 0.0 < extra["progress"] < 1.0  # the env's own episode metrics
        assert reward > extra["unshaped_return"]  # the velocity bonus is in the return the trainer reports
    assert all(scheme == {"velocity_bonus": [0.25, 2.0][p]} for p, scheme in shaping_of_envs())
