"""MinAtar's games as `--env=minatar_<game>` (appo/envs/minatar.py): uint8 images the encoders take as any image."""

import numpy as np
import pytest

from appo.envs import EnvError, env_info, make_env
from appo.envs.minatar import GAMES
from appo.spaces import auto_encoder


@pytest.mark.parametrize("game", GAMES)
def test_every_game_gives_uint8_channels_of_0_or_255(game):
    env = make_env(f"minatar_{game}")
    observation, _ = env.reset(seed=0)
    assert env.observation_space.dtype == np.uint8 and env.observation_space.shape[:2] == (10, 10)
    assert observation.dtype == np.uint8 and set(np.unique(observation)) <= {0, 255} and observation.max() == 255
    for _ in range(20):
        observation, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert env.observation_space.contains(observation) and np.isfinite(reward)
        if terminated or truncated:
            env.reset()
    env.close()


@pytest.mark.parametrize("game", GAMES)
def test_the_encoder_takes_the_last_axis_for_channels(game):
    """10 x 10 x channels whatever the count: Seaquest's 10 planes and Freeway's 7 are channels, not a side."""
    space = env_info(f"minatar_{game}").obs_space
    encoder, why = auto_encoder(space)
    assert (encoder, why.split(",")[:2]) == ("small_cnn", ["10x10 images", f" {space.shape[2]} channels last"])


def test_the_minimal_action_set_is_used():
    info = env_info("minatar_breakout")
    assert info.action_space.n == 3  # left, right, no-op: Breakout's minimal set (MinAtar's full set has 6)


def test_an_unknown_game_is_not_an_env():
    with pytest.raises(EnvError):
        make_env("minatar_pong")
