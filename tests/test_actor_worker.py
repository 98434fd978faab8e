"""The actor worker's stepping and slot handling, driven through its public interface (`setup`, `step`, `report`)
with real envs, buffers and queues.

`answer` plays the inference worker: it bumps a split's answer counter, as inference does after
writing the actions. `step(0.0)` never blocks: it steps the answered splits only."""

import contextlib

import pytest
from faster_fifo import Empty, Queue

from appo.config.cfg import env_kwargs, parse_config
from appo.envs import make_env
from appo.envs.registry import reward_shaping
from appo.memory.buffers import TRUNCATED, Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.messages import WAKE, ActorReport, WorkerReady
from appo.sampling.actor_worker import ActorWorker
from appo.workers.context import Queues, WorkerContext
from tests.conftest import wait_for


def make_context(*env_args: str, shaping: list[list[float]] | None = None) -> WorkerContext:
    """One actor's wiring over real buffers; `shaping[p]`: policy p's reward-shaping coefficients."""
    cfg = parse_config([*(env_args or ["--env=CartPole-v1"]), "--num_workers=1", "--num_envs_per_worker=4",
                        "--worker_num_splits=2", "--rollout=4", "--batch_size=16",
                        "--decorrelate_envs_on_one_worker=False"])
    env = make_env(cfg.env, env_kwargs(cfg))
    layout = Layout.from_cfg(cfg, env.observation_space, env.action_space)
    control = SharedControl(layout, cfg.num_policies, shaping_keys=tuple(reward_shaping(env)[0]))
    if shaping is not None:
        control.runner.reward_shaping[:] = shaping
    queues = Queues(report=Queue(), learner_inboxes=[Queue() for _ in range(cfg.num_policies)],
                    actor_inboxes=[Queue()], inference_wakeups=[[Queue()]])
    return WorkerContext(cfg, layout, (env.observation_space, env.action_space), TrajBuffers(layout), control,
                         queues, weights_names=[])


def make_worker(*env_args: str, shaping: list[list[float]] | None = None):
    """A started actor: every split has its slots and has asked for its first actions."""
    ctx = make_context(*env_args, shaping=shaping)
    worker = ActorWorker(ctx, 0)
    worker.setup()
    worker.step(0.0)
    assert ctx.control.actors.request_count[:, 0].max(axis=0).tolist() == [1] * ctx.layout.num_splits
    return worker, ctx


def answer(ctx: WorkerContext, s: int) -> None:
    """Every acting id asked by split s has answered (with the zero actions in the buffers)."""
    ctx.control.inference.answer_count[:, 0, s] = ctx.control.actors.request_count[:, 0, s]


def step_split(worker: ActorWorker, ctx: WorkerContext, s: int) -> None:
    """Answer split s and let the worker step it (the other splits wait for their answers)."""
    answer(ctx, s)
    worker.step(0.0)


def reports(worker: ActorWorker, ctx: WorkerContext) -> ActorReport:
    """Everything the worker reported so far (it reports once a second by itself), as one report."""
    worker.report()
    sent = []
    with contextlib.suppress(Empty):
        while True:
            sent += [m for m in ctx.queues.report.get_many(block=False) if isinstance(m, ActorReport)]
    return ActorReport(worker=0, env_steps=sum(r.env_steps for r in sent),
                       episodes=[e for r in sent for e in r.episodes], games=[g for r in sent for g in r.games],
                       timing={}, env_errors=sum(r.env_errors for r in sent),
                       illegal_actions=sum(r.illegal_actions for r in sent),
                       nonfinite=sum(r.nonfinite for r in sent), state=sent[-1].state,
                       every_env_ended=sent[-1].every_env_ended)


def is_ready(ctx: WorkerContext) -> bool:
    with contextlib.suppress(Empty):
        return any(isinstance(m, WorkerReady) for m in ctx.queues.report.get_many(block=False))
    return False


@pytest.mark.timeout(30)
def test_a_rollout_end_takes_slots_no_learner_owes_a_read():
    """The slots a learner still owes a read are not reused; once it clears them, the ending split takes them."""
    worker, ctx = make_worker()
    layout, owed = ctx.layout, ctx.control.slot_owed
    spare = worker.slots.free()
    owed[0, spare] = 1  # every spare slot is at the learner
    for _ in range(layout.rollout - 1):
        step_split(worker, ctx, 0)
    split = worker.splits[0]
    assert split.t == layout.rollout - 1
    before = ctx.control.actors.cur_slot[0, 0].copy()
    released = spare[:len(before)]
    owed[0, released] = 0  # the learner has read these (and sends a wake-up)
    ctx.queues.actor_inboxes[0].put(WAKE)

    step_split(worker, ctx, 0)

    assert split.t == 0 and not worker.answered(0)  # waits for the answer to its new request
    assert sorted(ctx.control.actors.cur_slot[0, 0].tolist()) == sorted(released.tolist())
    assert owed[0, before].all()  # the filled slots are owed to the learner now
    sent = ctx.queues.learner_inboxes[0].get(timeout=1)
    assert isinstance(sent, list) and sorted(sent) == sorted(before.tolist())  # a SlotHint
    assert ctx.control.actors.request_step[0, 0, 0] == 0


@pytest.mark.timeout(30)
def test_a_rollout_end_without_free_slots_waits_and_retries_at_each_step():
    """With no free slot the split waits (the other split does not step meanwhile); a later step moves it."""
    worker, ctx = make_worker()
    owed = ctx.control.slot_owed
    spare = worker.slots.free()
    owed[0, spare] = 1
    for _ in range(ctx.layout.rollout):
        step_split(worker, ctx, 0)
    requests = ctx.control.actors.request_count[0, 0].tolist()
    answer(ctx, 1)
    worker.step(0.0)  # split 1 is answered, but split 0 waits for slots: nothing steps
    assert ctx.control.actors.request_count[0, 0].tolist() == requests and worker.splits[1].t == 0
    owed[0, spare] = 0
    worker.step(0.0)  # split 0 moves onto fresh slots and asks; split 1 steps
    assert ctx.control.actors.request_count[0, 0].tolist() == [requests[0] + 1, requests[1] + 1]
    assert worker.splits[0].t == 0 and worker.splits[1].t == 1


@pytest.mark.timeout(30)
def test_a_replacement_worker_never_takes_a_slot_a_learner_owes_a_read():
    """An actor started after a crash (same buffers) leaves alone the slots its predecessor sent to a learner."""
    worker, ctx = make_worker()
    owed = ctx.control.slot_owed[0]
    sent = worker.slots.free()[:3]
    owed[sent] = 1
    replacement = ActorWorker(ctx, 0)
    replacement.setup()
    replacement.step(0.0)
    in_use = ctx.control.actors.cur_slot[0].ravel()
    assert set(in_use.tolist()).isdisjoint(sent.tolist())
    assert owed[sent].all()


@pytest.mark.timeout(30)
def test_a_replacement_waits_for_slots_when_learners_owe_nearly_all_of_them():
    """Its predecessor died while the learners were behind: one split's worth of slots is free, not two. Its
    start gives up at each step while too few are free, and goes on once the learner has caught up."""
    worker, ctx = make_worker()
    layout, owed = ctx.layout, ctx.control.slot_owed[0]
    slots = list(layout.worker_slots(0))
    owed[slots[layout.agents_per_split:]] = 1
    later = slots[-layout.agents_per_split:]
    is_ready(ctx)  # the first worker's
    replacement = ActorWorker(ctx, 0)
    replacement.setup()
    replacement.step(0.0)
    assert not is_ready(ctx)  # split 1 found no slots: the step gave up
    replacement.step(0.05)
    assert not is_ready(ctx)  # and gives up again while the learner is behind
    owed[later] = 0  # the learner catches up
    ctx.queues.actor_inboxes[0].put(WAKE)

    def started() -> bool:
        replacement.step(0.05)
        return is_ready(ctx)

    wait_for(started, 10, "start of the replacement")
    in_use = sorted(ctx.control.actors.cur_slot[0].ravel().tolist())
    assert in_use == sorted(slots[:layout.agents_per_split] + later)


@pytest.mark.timeout(30)
def test_a_non_finite_reward_is_stored_as_zero_logged_once_and_counted(caplog):
    worker, ctx = make_worker()
    slots = ctx.control.actors.cur_slot[0, 0].copy()
    env = worker.stepper.envs[0][1]
    env.unwrapped.step = lambda action: (env.unwrapped.state, float("nan"), False, False, {})
    for _ in range(2):
        step_split(worker, ctx, 0)
    assert ctx.traj.rewards[slots[1], :2].tolist() == [0.0, 0.0]
    assert reports(worker, ctx).nonfinite == 2 and worker.episodes.returns[0][1] == 0.0
    warnings = [r for r in caplog.records if "non-finite reward" in r.getMessage()]
    assert len(warnings) == 1 and "env 1 of split 0" in warnings[0].getMessage()


@pytest.mark.timeout(30)
def test_requests_wake_an_idle_inference_worker_only():
    worker, ctx = make_worker()
    step_split(worker, ctx, 0)  # inference busy: no message
    ctx.control.inference.idle[0, 0] = 1
    step_split(worker, ctx, 1)  # inference asleep: one wake-up
    assert ctx.queues.inference_wakeups[0][0].get_many(timeout=1) == [WAKE]
    assert list(ctx.control.actors.request_count[0, 0]) == [2, 2]


@pytest.mark.timeout(30)
def test_a_step_writes_rewards_dones_and_next_observations():
    worker, ctx = make_worker()
    traj = ctx.traj
    slots = ctx.control.actors.cur_slot[0, 1].copy()
    traj.actions[slots, 0] = 1
    step_split(worker, ctx, 1)
    assert (traj.rewards[slots, 0] == 1.0).all()  # CartPole's reward, unscaled (the learner scales it)
    assert not traj.dones[slots, 0].any()
    assert (traj.obs["obs"][slots, 1] != traj.obs["obs"][slots, 0]).any()
    assert worker.splits[1].t == 1 and reports(worker, ctx).env_steps == 2


@pytest.mark.timeout(30)
def test_a_time_limit_is_stored_as_truncation_and_the_episode_is_reported():
    # Synthetic episodes of 2 steps, ended by a time limit; rewards are 0 or 1.
    worker, ctx = make_worker("--env=sleep_env", '--env_kwargs={"step_seconds": 0, "episode_len": 2}')
    traj = ctx.traj
    slots = worker.splits[0].slots.copy()
    for _ in range(2):
        step_split(worker, ctx, 0)
    assert (traj.dones[slots, 0] == 0).all() and (traj.dones[slots, 1] == TRUNCATED).all()
    episodes = reports(worker, ctx).episodes
    assert len(episodes) == 2  # the split's two envs
    for episode in episodes:
        assert episode.policy == 0 and episode.length == 2 and episode.extra == {}
        assert episode.objective == episode.reward  # PBT's default objective: the return, without true_objective
    rewards = traj.rewards[slots, :2].sum(axis=1)
    assert sorted(episode.reward for episode in episodes) == sorted(rewards.tolist())
    assert not worker.episodes.every_env_ended()  # split 1's envs are still in their first episodes
    for _ in range(2):
        step_split(worker, ctx, 1)
    assert reports(worker, ctx).every_env_ended  # the runner may judge targets on this worker's episodes now


@pytest.mark.timeout(30)
def test_envs_play_with_their_policys_shaping_and_report_the_true_objective():
    pbt = ["--env=mountain_car_shaped", "--num_policies=2", "--with_pbt=True", "--agent_policy_mapping=episode"]
    worker, ctx = make_worker(*pbt, shaping=[[0.25], [0.75]])
    layout, control = ctx.layout, ctx.control

    def shaping_of_envs():
        return [(int(control.actors.agent_policy[0, s, i]), env.get_wrapper_attr("get_reward_shaping")())
                for s, envs in enumerate(worker.stepper.envs) for i, env in enumerate(envs)]
    assert all(scheme == {"velocity_bonus": [0.25, 0.75][p]} for p, scheme in shaping_of_envs())

    control.runner.reward_shaping[1] = [2.0]  # PBT moved policy 1's coefficient: envs take it at episode start
    for _ in range(200):  # MountainCar's time limit; action 0 (push left) never reaches the goal
        for s in range(layout.num_splits):
            answer(ctx, s)
        worker.step(0.0)
        for p, learner in enumerate(ctx.queues.learner_inboxes):  # the learners read the trajectories
            with contextlib.suppress(Empty):
                for slots in learner.get_many(block=False):
                    control.slot_owed[p, slots] = 0
    assert [split.t for split in worker.splits] == [0, 0]  # 200 steps of each split (50 rollouts)
    episodes = reports(worker, ctx).episodes
    assert len(episodes) == 4
    for episode in episodes:
        assert episode.length == 200 and episode.objective == 0.0  # the goal was not reached, whatever the return
        extra = episode.extra
        assert extra["true_objective"] == 0.0 and 0.0 < extra["progress"] < 1.0  # the env's own episode metrics
        assert episode.reward > extra["unshaped_return"]  # the velocity bonus is in the return the trainer reports
    assert all(scheme == {"velocity_bonus": [0.25, 2.0][p]} for p, scheme in shaping_of_envs())
