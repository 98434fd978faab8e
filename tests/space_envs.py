"""Toy envs for every supported observation and action space (used by tests/test_envs.py), and one observation space
no model takes (tests/test_bad_input.py).

Reward 1 when the first part of the action is 0 (or negative for Box), so each is learnable, but the tests
only check that the whole data path carries the spaces.
"""

import gymnasium as gym
import numpy as np

OBS = {
    "vector": gym.spaces.Box(-1.0, 1.0, (5,), np.float32),
    "image": gym.spaces.Box(0, 255, (3, 36, 36), np.uint8),
    "grey_image": gym.spaces.Box(0, 255, (36, 36), np.uint8),  # no channel axis (AtariPreprocessing's): a vector
    "dict": gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (3, 36, 36), np.uint8),
                             "state": gym.spaces.Box(-1.0, 1.0, (4,), np.float32)}),
    # Seen as one vector of one-hots, bits and floats (appo/envs/observations.py).
    "choices": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.MultiBinary(2),
                                 gym.spaces.Box(-1.0, 1.0, (2,), np.float32))),
}
ACTIONS = {
    "discrete": gym.spaces.Discrete(3),
    "multi_discrete": gym.spaces.MultiDiscrete([2, 3]),
    "multi_binary": gym.spaces.MultiBinary([2, 2]),  # a game pad's buttons, here of two axes
    "box": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "tuple": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1.0, 1.0, (1,), np.float32))),
}
# Not in ACTIONS (whose every combination is trained): a box off centre, asymmetric about 0, of unequal widths, where
# the model centres its Gaussian (tests/test_after_training.py exports it).
OFFSET_BOX = gym.spaces.Box(np.array([0.9, 0.0, -1.0], np.float32), np.array([1.0, 1.0, 3.0], np.float32))
# Nor these: choices numbered from a start other than 0 (the env's step refuses an action out of its space).
STARTED = {"discrete_start": gym.spaces.Discrete(3, start=-1),
           "multi_discrete_start": gym.spaces.MultiDiscrete([3, 2], start=[1, -1]),
           "grid_multi_discrete_start": gym.spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [-1, 2]])}
# Nor this one, which the trainer refuses (tests/test_bad_input.py): a Dict of actions, its repr over two lines.
DICT_OF_GRID = gym.spaces.Dict({"move": gym.spaces.Box(np.zeros((2, 2), np.float32),
                                                      np.array([[1.0, 1.0], [1.0, 2.0]], np.float32))})


class SpacesEnv(gym.Env):
    def __init__(self, obs: str = "vector", action: str = "discrete", image_size: int = 10):
        # Not in OBS, every combination of which is trained: "small_image", images smaller than the Nature CNN
        # takes, channels last; "text", strings, which have no fixed-size vector form; "scalar", a Box of shape ().
        self.observation_space = (gym.spaces.Box(0, 255, (image_size, image_size, 4), np.uint8) if obs == "small_image"
                                  else gym.spaces.Text(8) if obs == "text"
                                  else gym.spaces.Box(-1.0, 1.0, (), np.float32) if obs == "scalar" else OBS[obs])
        self.action_space = (OFFSET_BOX if action == "offset_box" else DICT_OF_GRID if action == "dict_of_grid"
                             else STARTED.get(action) or ACTIONS[action])
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action), f"{action!r} not in {self.action_space}"
        part = action[0] if isinstance(action, tuple) else next(iter(action.values())) if isinstance(action, dict) \
            else action
        first = np.ravel(part)[0]
        self.t += 1
        return self.observation_space.sample(), float(first <= 0), False, self.t >= 20, {}


def make_spaces_env(**kwargs) -> SpacesEnv:
    return SpacesEnv(**kwargs)


def make_spaces_env_of(obs: str, action: str) -> SpacesEnv:
    """Both spaces named, neither with a default: a make function that needs its --env_kwargs (test_bad_input.py)."""
    return SpacesEnv(obs=obs, action=action)
