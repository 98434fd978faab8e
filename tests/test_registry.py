"""How `--env` becomes an env the trainer can use (appo/envs/registry.py): observations the models take
(appo/envs/observations.py)."""

import gymnasium as gym
import numpy as np
import pytest

from appo.envs import env_info, make_env
from appo.envs.observations import ModelObservations, model_observation, model_space
from appo.spaces import SpaceError

IMAGE = gym.spaces.Box(0, 255, (3, 36, 36), np.uint8)


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

    observation, _ = ModelObservations(Shifted()).reset()
    assert observation.tolist() == [1.0, 0.0, 0.0]


def test_a_tuple_of_discretes_is_one_vector_of_one_hots():
    """Blackjack: player sum (32), dealer card (11), usable ace (2), one vector so that one MLP sees them together."""
    env = make_env("Blackjack-v1")
    observation, _ = env.reset(seed=0)
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (45,), dtype=np.float32)
    player, dealer, ace = env.unwrapped._get_obs()
    assert np.flatnonzero(observation).tolist() == [player, 32 + dealer, 43 + ace]
    assert env_info("Blackjack-v1").obs_space.shape == (45,)


def test_counts_and_flags_become_one_hot_choices_and_bits():
    cards = gym.spaces.MultiDiscrete([2, 3], start=[1, 0])
    assert model_observation(cards, np.array([2, 1])).tolist() == [0, 1, 0, 1, 0]
    flags = gym.spaces.MultiBinary([2, 2])
    assert model_space(flags) == gym.spaces.Box(0.0, 1.0, (4,), dtype=np.float32)
    assert model_observation(flags, np.array([[1, 0], [0, 1]], np.int8)).tolist() == [1, 0, 0, 1]


def test_a_dict_keeps_its_boxes_and_flattens_each_other_key():
    space = gym.spaces.Dict({"pixels": IMAGE, "action_mask": gym.spaces.Box(0, 1, (3,), np.int8),
                             "hand": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3))),
                             "turn": gym.spaces.Discrete(2)})
    seen = model_space(space)
    assert seen["pixels"] == IMAGE and seen["action_mask"] == space["action_mask"]
    assert seen["hand"].shape == (5,) and seen["turn"].shape == (2,) and seen["hand"].dtype == np.float32
    observation = model_observation(space, {"pixels": np.zeros((3, 36, 36), np.uint8), "hand": (1, 2), "turn": 0,
                                            "action_mask": np.ones(3, np.int8)})
    assert observation["hand"].tolist() == [0, 1, 0, 0, 1] and observation["turn"].tolist() == [1, 0]
    assert observation["pixels"].dtype == np.uint8 and seen.contains(observation)


def test_a_tuple_that_holds_an_image_keeps_its_parts_apart():
    space = gym.spaces.Tuple((IMAGE, gym.spaces.Discrete(3)))
    assert model_space(space) == gym.spaces.Dict({"0": IMAGE, "1": gym.spaces.Box(0.0, 1.0, (3,), np.float32)})
    observation = model_observation(space, (np.ones((3, 36, 36), np.uint8), 2))
    assert observation["0"].shape == (3, 36, 36) and observation["1"].tolist() == [0, 0, 1]


@pytest.mark.parametrize("space", [gym.spaces.Text(8), gym.spaces.Dict({
    "a": gym.spaces.Box(0, 1, (2,)), "b": gym.spaces.Sequence(gym.spaces.Discrete(2))})])
def test_a_space_of_no_fixed_size_is_refused_naming_it(space):
    with pytest.raises(SpaceError, match="unsupported observation space .* no fixed-size vector form"):
        model_space(space)


def test_a_turn_based_game_observing_a_discrete_sees_it_one_hot():
    """PettingZoo's rock-paper-scissors observes the opponent's last move as a Discrete beside its action mask."""
    pytest.importorskip("pettingzoo")
    env = make_env("pettingzoo.classic.rps_v2:env")
    observation, _ = env.reset(seed=0)
    assert env.observation_space["obs"] == gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    assert observation["obs"].shape == (2, 4) and (observation["obs"].sum(axis=1) == 1).all()


def test_vector_and_image_observations_are_left_as_they_are():
    assert not isinstance(make_env("CartPole-v1"), ModelObservations)
    assert make_env("CartPole-v1").observation_space.shape == (4,)
