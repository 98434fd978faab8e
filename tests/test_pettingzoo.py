"""PettingZoo ParallelEnvs as multi-agent envs: the adapter on a hand-written env (agents leaving mid-episode,
done codes, spaces that differ), the real mpe2 simple_spread through make_env, and a short training run."""

import importlib
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from appo.envs import EnvError, make_env
from appo.envs.pettingzoo_env import PettingZooEnv, is_aec_env, is_parallel_env
from appo.spaces import MASK_KEY
from tests.conftest import REPO, final_reward

TINY = "tests.test_pettingzoo:make_tiny"


class TinyParallelEnv:
    """A duck-typed PettingZoo ParallelEnv with agents "a", "b", "c" (no pettingzoo import).

    Agent k's observation is [k, t]; its reward every step it plays is 1 + k. Agents named in `terminate_at`
    terminate after that many steps, those in `truncate_at` are truncated then; agents named in neither are
    truncated after `max_steps`. An ended agent leaves `agents` and the returned dicts, as in PettingZoo.
    `odd_obs` / `odd_action` agents get a different observation / action space; with `dict_obs` observations
    are a Dict of that vector ("x") and a uint8 image filled with k ("img"). Every step's action dict is kept
    in `received`."""

    metadata = {"render_modes": ["rgb_array"], "name": "tiny_v0"}

    def __init__(self, terminate_at=None, truncate_at=None, max_steps=5, odd_obs=(), odd_action=(), dict_obs=False,
                 render_mode=None, num_agents=3):
        self.possible_agents = ["a", "b", "c"][:num_agents]
        self.agents: list[str] = []
        self.terminate_at, self.truncate_at = dict(terminate_at or {}), dict(truncate_at or {})
        self.max_steps, self.odd_obs, self.odd_action = max_steps, set(odd_obs), set(odd_action)
        self.dict_obs = dict_obs
        self.render_mode = render_mode
        self.received: list[dict] = []
        self.seeds: list = []
        self.closed = False
        self.t = 0

    def observation_space(self, agent):
        vector = gym.spaces.Box(-np.inf, np.inf, (3 if agent in self.odd_obs else 2,), np.float32)
        return gym.spaces.Dict({"x": vector, "img": gym.spaces.Box(0, 255, (2, 2), np.uint8)}) if self.dict_obs \
            else vector

    def action_space(self, agent):
        return gym.spaces.Discrete(4 if agent in self.odd_action else 3)

    def _obs(self, agent):
        k = self.possible_agents.index(agent)
        vector = np.array([k, self.t], dtype=np.float32)
        return {"x": vector, "img": np.full((2, 2), k, np.uint8)} if self.dict_obs else vector

    def reset(self, seed=None, options=None):
        self.agents, self.t, self.received = list(self.possible_agents), 0, []
        self.seeds.append(seed)
        return {agent: self._obs(agent) for agent in self.agents}, {agent: {"start": True} for agent in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), f"actions for {sorted(actions)}, agents {self.agents}"
        self.received.append(dict(actions))
        self.t += 1
        obs = {agent: self._obs(agent) for agent in self.agents}
        rewards = {agent: 1.0 + self.possible_agents.index(agent) for agent in self.agents}
        terminations = {agent: self.terminate_at.get(agent) == self.t for agent in self.agents}
        truncations = {agent: self.truncate_at.get(agent, None if agent in self.terminate_at else self.max_steps)
                       == self.t for agent in self.agents}
        infos = {agent: {"t": self.t} for agent in self.agents}
        self.agents = [agent for agent in self.agents if not terminations[agent] and not truncations[agent]]
        return obs, rewards, terminations, truncations, infos

    def render(self):
        return np.zeros((4, 4, 3), np.uint8) if self.render_mode == "rgb_array" else None

    def close(self):
        self.closed = True


def make_tiny(**kwargs) -> TinyParallelEnv:
    return TinyParallelEnv(**kwargs)


def run_episode(env: PettingZooEnv, actions=(0, 1, 2)) -> list[tuple]:
    env.reset(seed=0)
    steps = []
    while True:
        steps.append(env.step(list(actions)))
        if steps[-1][2] or steps[-1][3]:
            return steps


@pytest.mark.timeout(30)
def test_make_env_wraps_a_parallel_env_with_fixed_seats():
    env = make_env(TINY)
    assert isinstance(env, PettingZooEnv) and isinstance(env, gym.Env)
    assert env.num_agents == 3 and env.possible_agents == ["a", "b", "c"]
    assert env.observation_space == gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    assert env.action_space == gym.spaces.Discrete(3)
    obs, info = env.reset(seed=7)
    assert env.env.seeds == [7]
    assert obs.shape == (3, 2) and obs.dtype == np.float32 and obs[:, 0].tolist() == [0, 1, 2]  # seat order
    assert info["agents"]["b"] == {"start": True} and info["active"].tolist() == [True] * 3
    obs, rewards, terminated, truncated, info = env.step(np.array([2, 1, 0]))
    assert env.env.received == [{"a": 2, "b": 1, "c": 0}]
    assert obs.shape == (3, 2) and obs[:, 1].tolist() == [1, 1, 1]
    assert rewards.dtype == np.float32 and rewards.tolist() == [1.0, 2.0, 3.0]
    assert terminated is False and truncated is False and info["agents"]["c"] == {"t": 1}
    with pytest.raises(ValueError, match="one action per agent"):
        env.step([0, 1])


@pytest.mark.timeout(30)
def test_an_agent_that_leaves_keeps_its_seat_with_zeros_and_reward_0():
    env = make_env(TINY, {"terminate_at": {"b": 2}, "max_steps": 4})
    steps = run_episode(env)
    assert len(steps) == 4  # the episode ends when the last agent leaves, not when b does
    obs, rewards, terminated, truncated, info = steps[1]  # b's last step: its own last observation and reward
    assert obs[1].tolist() == [1, 2] and rewards.tolist() == [1.0, 2.0, 3.0]
    assert info["active"].tolist() == [True, False, True] and not (terminated or truncated)
    for obs, rewards, _, _, info in steps[2:]:
        assert obs[1].tolist() == [0, 0] and rewards[1] == 0.0 and info["active"][1] == False  # noqa: E712
        assert rewards[0] == 1.0 and rewards[2] == 3.0
    assert [sorted(actions) for actions in env.env.received] == [["a", "b", "c"]] * 2 + [["a", "c"]] * 2
    obs, rewards, terminated, truncated, info = steps[-1]
    assert (terminated, truncated) == (False, True)  # a and c ran out of time: truncated for every seat
    assert info["active"].tolist() == [False] * 3 and obs[0].tolist() == [0, 4]  # a's last observation
    assert "episode_extra_stats" not in info
    # The next episode gives every seat its place back.
    obs, _ = env.reset()
    assert obs[1].tolist() == [1, 0]
    assert env.step([0, 1, 2])[1].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.timeout(30)
def test_done_codes_terminated_only_when_every_agent_terminated():
    all_terminated = run_episode(make_env(TINY, {"terminate_at": {"a": 1, "b": 3, "c": 2}}))
    assert len(all_terminated) == 3 and all_terminated[-1][2:4] == (True, False)
    assert [step[1].tolist() for step in all_terminated] == [[1, 2, 3], [0, 2, 3], [0, 2, 0]]
    mixed = run_episode(make_env(TINY, {"terminate_at": {"a": 1, "b": 2}, "truncate_at": {"c": 3}}))
    assert len(mixed) == 3 and mixed[-1][2:4] == (False, True)
    one_late_truncation = run_episode(make_env(TINY, {"terminate_at": {"a": 1, "b": 1}, "max_steps": 2}))
    assert one_late_truncation[-1][2:4] == (False, True)


@pytest.mark.timeout(30)
def test_dict_observations_are_stacked_per_key_in_their_dtype():
    env = make_env(TINY, {"dict_obs": True, "terminate_at": {"c": 1}})
    obs, _ = env.reset(seed=0)
    assert obs["x"].shape == (3, 2) and obs["x"].dtype == np.float32
    assert obs["img"].shape == (3, 2, 2) and obs["img"].dtype == np.uint8 and obs["img"][:, 0, 0].tolist() == [0, 1, 2]
    env.step([0, 0, 0])
    obs = env.step([0, 0, 0])[0]
    assert obs["x"][2].tolist() == [0, 0] and obs["img"][2].tolist() == [[0, 0], [0, 0]]  # c is gone
    assert obs["x"][1].tolist() == [1, 2]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"odd_obs": ["b", "c"]}, "observation space of b, c (Box(3,) float32) differs from a's (Box(2,) float32)"),
    ({"odd_action": ["c"]}, "action space of c (Discrete(4)) differs from a's (Discrete(3))"),
])
def test_agents_with_different_spaces_are_a_one_line_error(kwargs, expected):
    with pytest.raises(EnvError) as error:
        make_env(TINY, kwargs)
    message = str(error.value)
    assert message.startswith(f"--env={TINY}: ") and expected in message and "\n" not in message


@pytest.mark.timeout(30)
def test_render_mode_render_and_close_are_forwarded():
    env = make_env(TINY, render_mode="rgb_array")
    assert env.render_mode == "rgb_array" and "rgb_array" in env.metadata["render_modes"]
    env.reset(seed=0)
    assert env.render().shape == (4, 4, 3)
    assert make_env(TINY).render() is None
    env.close()
    assert env.env.closed


@pytest.mark.timeout(30)
def test_duck_typing_tells_parallel_from_aec_and_gym_envs():
    class TinyAEC(TinyParallelEnv):
        def last(self):
            return None

    assert is_parallel_env(TinyParallelEnv()) and not is_aec_env(TinyParallelEnv())
    assert is_aec_env(TinyAEC()) and not is_parallel_env(TinyAEC())
    assert not is_parallel_env(gym.make("CartPole-v1")) and not is_parallel_env(make_env("coop_multi_agent"))


@pytest.mark.timeout(30)
def test_real_pettingzoo_aec_env_is_stepped_one_agent_at_a_time():
    """An AEC env is taken as it is (appo/envs/pettingzoo_turns.py): MPE's, whose agents act one after the other
    before the world moves, gets a seat per agent and the mover's mask (no mask of its own: every action)."""
    env = make_env("mpe2.simple_spread_v3:env")
    try:
        assert env.turn_based and env.num_agents == 3
        obs, _ = env.reset(seed=0)
        assert obs[MASK_KEY].tolist() == [[1] * 5, [0] * 5, [0] * 5]
        obs, *_ = env.step([0, 0, 0])
        assert obs[MASK_KEY].tolist() == [[0] * 5, [1] * 5, [0] * 5]
    finally:
        env.close()


@pytest.mark.timeout(30)
def test_missing_mpe2_names_the_extra(monkeypatch):
    with pytest.raises(EnvError, match="module 'mpe2.no_such_env' not found; fix the module path$"):
        make_env("mpe2.no_such_env:parallel_env")

    class Blocker:
        """Makes `import mpe2` fail as it does where the package is not installed."""

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "mpe2":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    for name in [name for name in sys.modules if name.split(".")[0] == "mpe2"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Blocker(), *sys.meta_path])
    with pytest.raises(EnvError) as error:
        make_env("mpe2.simple_spread_v3:parallel_env")
    assert str(error.value) == ("--env=mpe2.simple_spread_v3:parallel_env: module 'mpe2' not found; "
                                'pip install -e ".[pettingzoo]"')


def test_an_env_of_one_agent_is_a_single_agent_env():
    """One observation, one reward and one action, not stacks of one (MPE's simple_v3 failed in the actor)."""
    env = make_env(TINY, {"num_agents": 1, "max_steps": 3})
    assert env.num_agents == 1 and env.observation_space.shape == (2,)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2,)
    for t in range(1, 4):
        obs, reward, terminated, truncated, _ = env.step(2)
        assert obs.shape == (2,) and obs[1] == t and reward == 1.0 and isinstance(reward, float)
        assert (terminated, truncated) == (False, t == 3)
    assert env.env.received[-1] == {"a": 2}
    dict_env = make_env(TINY, {"num_agents": 1, "dict_obs": True})
    assert {key: value.shape for key, value in dict_env.reset(seed=0)[0].items()} == {"x": (2,), "img": (2, 2)}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_mpe2_simple_of_one_agent_trains(trainer):
    result = trainer.run("--env=mpe2.simple_v3:parallel_env", '--env_kwargs={"max_cycles": 25}', "--experiment=simple",
                         "--train_for_env_steps=5000", "--num_workers=1", "--num_envs_per_worker=4", timeout=50)
    assert result.returncode == 0, result.stdout + result.stderr
    assert final_reward(trainer.train_dir, "simple") < 0  # episodes finished and were reported (a distance)


@pytest.mark.timeout(30)
def test_mpe2_simple_spread_through_make_env():
    env = make_env("mpe2.simple_spread_v3:parallel_env", {"max_cycles": 25})
    assert isinstance(env, PettingZooEnv) and env.num_agents == 3
    assert env.observation_space.shape == (18,) and env.action_space == gym.spaces.Discrete(5)
    obs, _ = env.reset(seed=3)
    assert obs.shape == (3, 18) and obs.dtype == np.float32
    again, _ = env.reset(seed=3)
    np.testing.assert_array_equal(obs, again)  # the seed reaches the env
    env.action_space.seed(0)
    for t in range(1, 26):
        obs, rewards, terminated, truncated, info = env.step([env.action_space.sample() for _ in range(3)])
        assert obs.shape == (3, 18) and rewards.shape == (3,) and rewards.dtype == np.float32
        assert np.isfinite(rewards).all() and (rewards <= 0).all()
        assert (terminated, truncated) == (False, t == 25)  # every agent is truncated at max_cycles
    env.close()
    continuous = make_env("mpe2.simple_spread_v3:parallel_env", {"max_cycles": 5, "continuous_actions": True})
    assert isinstance(continuous.action_space, gym.spaces.Box) and continuous.action_space.shape == (5,)
    continuous.reset(seed=0)
    assert continuous.step(np.full((3, 5), 0.5, np.float32))[0].shape == (3, 18)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_agents_with_different_spaces_stop_the_trainer_with_one_line(tmp_path):
    assert importlib.import_module("mpe2.simple_adversary_v3")  # adversary_0 observes 8 numbers, agents 10
    result = subprocess.run([sys.executable, "-m", "appo.train", "--env=mpe2.simple_adversary_v3:parallel_env",
                             f"--train_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2  # bad input, as for any env that cannot be made
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "observation space of agent_0, agent_1 (Box(10,) float32)" in lines[0], result.stderr


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_simple_spread_trains(trainer):
    result = trainer.run("--env=mpe2.simple_spread_v3:parallel_env", '--env_kwargs={"max_cycles": 25}',
                         "--experiment=spread", "--train_for_env_steps=20000", "--num_workers=1",
                         "--num_envs_per_worker=4", "--report_interval=1", timeout=80)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Stopped: reached --train_for_env_steps=20000" in result.stdout
    assert final_reward(trainer.train_dir, "spread") < 0  # episodes finished and were reported (rewards are distances)
