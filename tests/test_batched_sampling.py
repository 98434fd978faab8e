"""Batched sampling (--batched_sampling, envpool:<task id>): one vectorised env per split, stepped in one call.

The actor is driven in this process through its public interface with real envs, buffers and queues; the test plays
inference by writing actions into the split's slots and bumping its answer counter (as tests/test_actor_worker.py
does). Checked: a vectorised split fills the trajectory exactly as the per-env path does (row by row, on a seeded
deterministic env with a vector entry point), an ended sub-env's next row holds its next episode's first observation
and the action of that row acts on it (CartPole's physics, gymnasium's vector env and EnvPool), episode statistics
equal a reference loop over the trajectory, a multi-agent env is refused at start-up, and CartPole learns."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys

import gymnasium as gym
import numpy as np
import pytest
from faster_fifo import Empty, Queue
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space

from appo.config.cfg import env_kwargs, parse_config, resolve
from appo.config.checks import ConfigError
from appo.envs import make_env
from appo.envs.vector import EnvPoolSameStep, SameStepCartPole, make_vector_env
from appo.memory.buffers import TERMINATED, TRUNCATED, Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.messages import ActorReport, EpisodeEnd
from appo.sampling.actor_worker import ActorWorker
from appo.sampling.vector_stepper import to_env_actions
from appo.spaces import SINGLE_KEY, to_env_action
from appo.workers.context import Queues, WorkerContext
from tests.conftest import final_reward

needs_envpool = pytest.mark.skipif(sys.version_info < (3, 11), reason="EnvPool 1.2 needs Python 3.11")


# ---------------------------------------------------------------- a seeded deterministic env, per env and vectorised
class CountEnv(gym.Env):
    """Observation (position, start + steps), the start drawn from the seeded np_random at reset; an action of 0..2
    moves that far; reward 10 * action + position; the episode ends at position 7 (terminated) or after 6 steps
    (truncated), with its true objective in the last info."""

    observation_space = gym.spaces.Box(0, 100, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.start, self.position, self.steps = int(self.np_random.integers(0, 10)), 0, 0
        return self._obs(), {}

    def step(self, action):
        self.position += int(action)
        self.steps += 1
        terminated = self.position >= 7
        truncated = not terminated and self.steps >= 6
        info = {"true_objective": 100.0 * self.position} if terminated or truncated else {}
        return self._obs(), 10.0 * int(action) + self.position, terminated, truncated, info

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.start + self.steps], np.float32)


class CountVectorEnv(VectorEnv):
    """CountEnv vectorised in numpy, sub-env i seeded seed + i; resets ended sub-envs in the same step, or (NEXT_STEP)
    at the next, ignoring that step's action, as gymnasium's own vector envs do."""

    def __init__(self, num_envs: int, autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP):
        self.num_envs, self.mode = num_envs, autoreset_mode
        self.metadata = {"autoreset_mode": autoreset_mode}
        self.single_observation_space, self.single_action_space = CountEnv.observation_space, CountEnv.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.rngs = [seeding.np_random(None if seed is None else seed + i)[0] for i in range(self.num_envs)]
        self.start, self.position, self.steps = (np.zeros(self.num_envs, np.int64) for _ in range(3))
        self.pending = np.ones(self.num_envs, bool)
        self._reset_where(self.pending)
        return self._obs(), {}

    def _reset_where(self, mask: np.ndarray) -> None:
        for i in np.flatnonzero(mask).tolist():
            self.start[i] = self.rngs[i].integers(0, 10)
        self.position[mask], self.steps[mask], self.pending[mask] = 0, 0, False

    def step(self, actions):
        moving = ~self.pending
        self._reset_where(self.pending)
        self.position[moving] += actions[moving]
        self.steps[moving] += 1
        rewards = np.where(moving, 10.0 * actions + self.position, 0.0)
        terminated = moving & (self.position >= 7)
        truncated = moving & ~terminated & (self.steps >= 6)
        ended = terminated | truncated
        objective = {"true_objective": 100.0 * self.position, "_true_objective": ended}
        if self.mode == AutoresetMode.SAME_STEP:
            info = {"final_info": objective, "_final_info": ended} if ended.any() else {}
            self._reset_where(ended)
        else:
            info = objective if ended.any() else {}
            self.pending = ended
        return self._obs(), rewards, terminated, truncated, info

    def _obs(self) -> np.ndarray:
        return np.stack([self.position, self.start + self.steps], axis=1).astype(np.float32)


COUNT, COUNT_NEXT_STEP = "BatchedCount-v0", "BatchedCountNextStep-v0"
if COUNT not in gym.registry:
    gym.register(COUNT, entry_point=CountEnv, vector_entry_point=CountVectorEnv)
    gym.register(COUNT_NEXT_STEP, entry_point=CountEnv,
                 vector_entry_point=functools.partial(CountVectorEnv, autoreset_mode=AutoresetMode.NEXT_STEP))


# ---------------------------------------------------------------- an actor driven in this process
def make_context(*flags: str) -> WorkerContext:
    """One actor's wiring over real buffers: 2 splits of 8 envs, rollouts of 64 steps, --seed=5, and `flags`."""
    cfg = parse_config(["--num_workers=1", "--num_envs_per_worker=16", "--worker_num_splits=2", "--rollout=64",
                        "--batch_size=128", "--seed=5", "--decorrelate_envs_on_one_worker=False", *flags])
    env = make_env(cfg.env, env_kwargs(cfg))
    layout = Layout.from_cfg(cfg, env.observation_space, env.action_space)
    queues = Queues(report=Queue(), learner_inboxes=[Queue()], actor_inboxes=[Queue()], inference_wakeups=[[Queue()]])
    return WorkerContext(cfg, layout, (env.observation_space, env.action_space), TrajBuffers(layout),
                         SharedControl(layout, cfg.num_policies), queues, weights_names=[])


def drive(env_id: str, batched: bool, steps: int, num_actions: int) -> tuple[WorkerContext, list[EpisodeEnd]]:
    """Run an actor for `steps` steps of each split with seeded random actions; its context and the episodes it
    reported. Steps stay within one rollout: every env-agent keeps its slot."""
    ctx = make_context(f"--env={env_id}", f"--batched_sampling={batched}")
    worker = ActorWorker(ctx, 0)
    worker.setup()
    worker.step(0.0)
    rng = np.random.default_rng(0)
    answers = ctx.control.inference.answer_count
    for _ in range(steps):
        for s in range(ctx.layout.num_splits):
            slots, t = ctx.control.actors.cur_slot[0, s], worker.splits[s].t
            ctx.traj.actions[slots, t] = rng.integers(0, num_actions, len(slots))
            answers[:, 0, s] = ctx.control.actors.request_count[:, 0, s]  # as inference does once actions are written
            worker.step(0.0)
    worker.report()
    worker.close()
    episodes = []
    with contextlib.suppress(Empty):
        while True:
            episodes += [e for m in ctx.queues.report.get_many(block=False) if isinstance(m, ActorReport)
                         for e in m.episodes]
    return ctx, episodes


def used_slots(ctx: WorkerContext) -> np.ndarray:
    return ctx.control.actors.cur_slot[0].ravel()


def reference_episodes(ctx: WorkerContext, steps: int) -> list[tuple[float, int]]:
    """(return, length) of every episode that ended, from the trajectory rows: a plain loop per env and step."""
    found = []
    for slot in used_slots(ctx).tolist():
        total, length = 0.0, 0
        for t in range(steps):
            total, length = total + float(ctx.traj.rewards[slot, t]), length + 1
            if ctx.traj.dones[slot, t]:
                found.append((total, length))
                total, length = 0.0, 0
    return sorted(found)


# ---------------------------------------------------------------- the tests
@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_id", [COUNT, COUNT_NEXT_STEP])
def test_a_batched_split_fills_the_trajectory_as_the_per_env_path_does(env_id):
    steps = 30
    per_env, per_env_episodes = drive(env_id, batched=False, steps=steps, num_actions=3)
    batched, batched_episodes = drive(env_id, batched=True, steps=steps, num_actions=3)
    slots = used_slots(per_env)
    assert (used_slots(batched) == slots).all()
    for name in ("actions", "rewards", "dones", "policy_ids"):
        assert np.array_equal(getattr(batched.traj, name)[slots, :steps], getattr(per_env.traj, name)[slots, :steps]), \
            name
    observations = batched.traj.obs[SINGLE_KEY][slots, :steps + 1]
    assert np.array_equal(observations, per_env.traj.obs[SINGLE_KEY][slots, :steps + 1])
    dones = per_env.traj.dones[slots, :steps]
    assert (dones == TERMINATED).any() and (dones == TRUNCATED).any()
    # After an end the next row is the next episode's first observation: position 0, step count = its seeded start.
    ended = dones > 0
    assert (observations[:, 1:][ended][:, 0] == 0).all()
    assert batched_episodes == per_env_episodes and len(batched_episodes) == int(ended.sum())
    assert {e.objective for e in batched_episodes} <= {100.0 * position for position in range(9)}  # the last info's
    assert sorted((e.reward, e.length) for e in batched_episodes) == reference_episodes(batched, steps)


@pytest.mark.timeout(90)
def test_a_seeded_serial_run_trains_the_same_weights_batched_or_not(tmp_path):
    import torch

    from appo import train

    def final_weights(batched: bool) -> dict:
        result = train(env=COUNT, experiment=f"batched_{batched}", train_dir=str(tmp_path), serial_mode=True, seed=3,
                       batched_sampling=batched, num_workers=1, worker_num_splits=1, num_envs_per_worker=8,
                       rollout=8, batch_size=64, num_batches_per_iteration=1, learning_rate=1e-3,
                       train_for_env_steps=3000, decorrelate_envs_on_one_worker=False)  # all given: no auto rule
        return torch.load(result.checkpoint, weights_only=False)["model"]

    per_env, batched = final_weights(False), final_weights(True)
    assert per_env.keys() == batched.keys() and all(torch.equal(per_env[k], batched[k]) for k in per_env)


def test_next_step_vector_entry_points_are_made_same_step():
    assert isinstance(make_vector_env("CartPole-v1", 4), SameStepCartPole)
    assert isinstance(make_vector_env(COUNT, 4), CountVectorEnv)  # resets in the same step by itself
    assert isinstance(make_vector_env(COUNT_NEXT_STEP, 4), SyncVectorEnv)  # no partial reset: stepped as sync


def check_cartpole_rows(ctx: WorkerContext, steps: int) -> None:
    """Every row's action acts on that row's observation (CartPole's physics from it gives the next row), except at
    an episode end, whose next row is a new episode's first observation (gymnasium's reset bounds)."""
    reference = CartPoleEnv()
    reference.reset(seed=0)
    slots = used_slots(ctx)
    obs, actions, dones = (ctx.traj.obs[SINGLE_KEY][slots], ctx.traj.actions[slots], ctx.traj.dones[slots])
    rewards = ctx.traj.rewards[slots]
    assert (rewards[:, :steps] == 1.0).all()
    ends = 0
    for i in range(len(slots)):
        for t in range(steps):
            if dones[i, t]:
                ends += 1
                assert (np.abs(obs[i, t + 1]) <= 0.05).all()
                continue
            reference.state, reference.steps_beyond_terminated = obs[i, t].astype(np.float64), None
            predicted = reference.step(int(actions[i, t]))[0]
            assert np.allclose(obs[i, t + 1], predicted, atol=1e-5), (i, t)
    assert ends > len(slots)  # random actions: every sub-env ended episodes (about 22 steps each), some twice


@pytest.mark.timeout(60)
def test_gymnasium_cartpole_vector_env_each_action_reaches_its_sub_env_and_episodes_are_exact():
    steps = 60
    ctx, episodes = drive("CartPole-v1", batched=True, steps=steps, num_actions=2)
    check_cartpole_rows(ctx, steps)
    assert sorted((e.reward, e.length) for e in episodes) == reference_episodes(ctx, steps)


@needs_envpool
@pytest.mark.timeout(60)
def test_envpool_each_action_reaches_its_sub_env_and_episodes_are_exact():
    steps = 60
    ctx, episodes = drive("envpool:CartPole-v1", batched=False, steps=steps, num_actions=2)  # EnvPool: batched always
    check_cartpole_rows(ctx, steps)
    assert sorted((e.reward, e.length) for e in episodes) == reference_episodes(ctx, steps)


@needs_envpool
@pytest.mark.timeout(60)
def test_envpool_resets_an_ended_sub_env_within_its_step_and_leaves_the_others():
    env = make_vector_env("envpool:CartPole-v1", 4, seed=1)
    assert isinstance(env, EnvPoolSameStep)
    env.reset()
    pushes = np.array([0, 0, 1, 1])
    ends = 0
    for _ in range(100):
        obs, rewards, terminated, truncated, _ = env.step(pushes)
        ended = terminated | truncated
        ends += int(ended.sum())
        assert (rewards == 1.0).all()  # never the 0 of a step spent resetting
        assert (np.abs(obs[ended]) <= 0.05).all()  # the next episode's first observation
    assert ends >= 8  # always pushed one way, each pole falls within about 10 steps
    single = make_env("envpool:CartPole-v1")  # the per-env API, for the runner's look at the spaces
    assert single.reset()[0].shape == single.observation_space.shape == (4,)
    env.close()
    single.close()


def test_stored_actions_reach_a_vectorised_env_as_the_per_env_path_gives_them():
    rng = np.random.default_rng(0)
    cases = [(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), rng.normal(0, 2, (5, 2)).astype(np.float32)),
             (gym.spaces.MultiDiscrete([3, 4]), rng.integers(0, 3, (5, 2))),
             (gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))),
              np.concatenate([rng.integers(0, 3, (5, 1)), rng.normal(0, 2, (5, 2))], axis=1).astype(np.float32)),
             # choices numbered from a start other than 0: the model's choice i is the env's start + i
             (gym.spaces.Discrete(3, start=-1), np.array([0, 1, 2, 2, 0])),
             (gym.spaces.MultiDiscrete([3, 2], start=[1, -1]), np.array([[0, 0], [2, 1], [1, 1], [0, 1], [2, 0]])),
             (gym.spaces.Tuple((gym.spaces.Discrete(2, start=5), gym.spaces.Box(-1.0, 1.0, (1,), np.float32))),
              np.array([[0, 0.5], [1, -0.5]], np.float32)),
             (gym.spaces.MultiBinary([2, 2]), rng.integers(0, 2, (5, 4))),
             (gym.spaces.Tuple((gym.spaces.MultiBinary(2), gym.spaces.Box(-1.0, 1.0, (1,), np.float32))),
              np.array([[0, 1, 0.5], [1, 1, -0.5]], np.float32))]
    for space, rows in cases:
        batched = to_env_actions(space, rows)
        assert batch_space(space, len(rows)).contains(batched), space
        per_row = [to_env_action(space, row) for row in rows]
        if isinstance(space, gym.spaces.Tuple):
            for k, part in enumerate(batched):
                assert np.array_equal(part, np.stack([np.asarray(action[k]) for action in per_row])), space
        else:
            assert np.array_equal(batched, np.stack(per_row)), space
        assert all(space.contains(action) for action in per_row), space
    assert to_env_action(gym.spaces.Discrete(3, start=-1), np.array(0)) == -1


def test_a_multi_agent_env_with_batched_sampling_is_refused_in_one_line():
    cfg = parse_config(["--env=CartPole-v1", "--batched_sampling=True"])
    resolve(cfg, num_agents=1)
    with pytest.raises(ConfigError, match="single-agent envs only"):
        resolve(cfg, num_agents=2)  # the start-up's resolution of the flags, once the env's agents are known
    resolve(parse_config(["--env=CartPole-v1"]), num_agents=2)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_cartpole_learns_with_batched_sampling(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=batched", "--batched_sampling=True",
                         "--train_for_env_steps=120000", "--num_workers=2", "--num_envs_per_worker=16",
                         "--report_interval=1")
    assert result.returncode == 0, result.stdout + result.stderr
    # A random policy averages about 22; learning takes it far above that within 120k steps.
    assert final_reward(trainer.train_dir, "batched") > 80


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pbt_runs_on_batched_sub_envs(trainer):
    """Each sub-env is an env of one agent, so policies are mapped per sub-env: a PBT population trains every policy
    and makes its decisions as on the per-env path (tests/test_pbt_run.py)."""
    from tests.test_pbt_run import PBT, history

    result = trainer.run(*PBT, "--batched_sampling=True", "--train_for_env_steps=40000", timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(event["kind"] == "replace" for event in history(os.path.join(trainer.train_dir, "pbt")))
    assert "took over the weights and optimizer state of policy" in result.stdout
    for policy in range(3):
        assert re.search(rf"p{policy}: final reward [0-9.]+", result.stdout), result.stdout[-2000:]
