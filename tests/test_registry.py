"""How `--env` becomes an env the trainer can use (appo/envs/registry.py): observations the models take."""

import gymnasium as gym
import numpy as np

from appo.envs import env_info, make_env
from appo.envs.registry import OneHotObservation


def test_a_discrete_observation_is_a_one_hot_vector():
    env = make_env("Taxi-v4")
    observation, _ = env.reset(seed=0)
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (500,), dtype=np.float32)
    state = env.unwrapped.s
    assert observation[state] == 1.0 and observation.sum() == 1.0 and env.observation_space.contains(observation)
    observation, *_ = env.step(0)
    assert observation[env.unwrapped.s] == 1.0 and observation.sum() == 1.0
    assert env_info("Taxi-v4").obs_space.shape == (500,)


def test_a_discrete_space_that_starts_elsewhere_counts_from_its_start():
    class Shifted(gym.Env):
        observation_space, action_space = gym.spaces.Discrete(3, start=-1), gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return -1, {}

    observation, _ = OneHotObservation(Shifted()).reset()
    assert observation.tolist() == [1.0, 0.0, 0.0]


def test_vector_and_image_observations_are_left_as_they_are():
    assert not isinstance(make_env("CartPole-v1"), OneHotObservation)
    assert make_env("CartPole-v1").observation_space.shape == (4,)
