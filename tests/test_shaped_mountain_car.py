"""The reward-shaping interface of the shaped MountainCar env, without trainer processes."""

import random

import gymnasium as gym
import pytest

from appo.envs import env_info, make_env
from appo.envs.shaped_mountain_car import DEFAULT_PUSH_COST, DEFAULT_VELOCITY_BONUS, make_shaped_mountain_car
from appo.population import pbt


def _run_episode(env: gym.Env, policy) -> tuple[list[float], bool, bool, dict]:
    obs, _ = env.reset(seed=0)
    rewards = []
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        rewards.append(reward)
        if terminated or truncated:
            return rewards, terminated, truncated, info


def _bang_bang(obs) -> int:
    return 2 if obs[1] >= 0 else 0  # push along the velocity: pumps energy in, reaches the goal in ~100 steps


def test_get_set_round_trip_and_unknown_key():
    env = make_env("mountain_car_shaped")
    assert env.get_reward_shaping() == {"velocity_bonus": DEFAULT_VELOCITY_BONUS}
    env.set_reward_shaping({"velocity_bonus": 0.7})
    assert env.get_reward_shaping() == {"velocity_bonus": 0.7}
    with pytest.raises(ValueError, match="speed_bonus"):
        env.set_reward_shaping({"velocity_bonus": 0.1, "speed_bonus": 1.0})
    assert env.get_reward_shaping() == {"velocity_bonus": 0.7}  # a rejected scheme changes nothing
    assert make_env("mountain_car_shaped", {"velocity_bonus": 2.0}).get_reward_shaping() == {"velocity_bonus": 2.0}


def test_bonus_is_added_and_fuel_charged_per_step():
    shaped = make_shaped_mountain_car(velocity_bonus=0.5)
    plain = gym.make("MountainCar-v0", disable_env_checker=True)
    shaped.reset(seed=3)
    plain.reset(seed=3)
    for t in range(60):
        action = t % 3
        obs, reward, *_ = shaped.step(action)
        plain_obs, plain_reward, *_ = plain.step(action)
        fuel = DEFAULT_PUSH_COST if action != 1 else 0.0  # action 1 coasts
        assert (obs == plain_obs).all()
        assert reward == pytest.approx(plain_reward - fuel + 0.5 * abs(plain_obs[1]) / 0.07)
        assert plain_reward - fuel <= reward <= plain_reward - fuel + 0.5
    shaped.set_reward_shaping({"velocity_bonus": 0.0})  # takes effect on the next step
    _, reward, *_ = shaped.step(1)
    assert reward == -1.0


def test_episode_metrics_at_episode_end():
    env = make_shaped_mountain_car(velocity_bonus=1.0)
    rewards, terminated, truncated, info = _run_episode(env, lambda obs: 1)  # no push: never gets there
    extra = info["episode_extra_stats"]
    assert truncated and not terminated and len(rewards) == 200
    assert info["true_objective"] == extra["true_objective"] == 0.0
    assert extra["unshaped_return"] == -200.0  # coasting burns no fuel
    assert sum(rewards) > -200.0  # the bonus, which the objective ignores
    idle_progress = extra["progress"]
    assert 0.3 < idle_progress < 0.6  # rolled a little way up from the valley floor, far from the goal

    rewards, terminated, truncated, info = _run_episode(env, lambda obs: 2 if obs[1] >= 0 and obs[0] < -0.3 else 0)
    assert truncated and idle_progress < info["episode_extra_stats"]["progress"] < 1.0  # higher, not there

    rewards, terminated, truncated, info = _run_episode(env, _bang_bang)
    extra = info["episode_extra_stats"]
    assert terminated and len(rewards) < 200
    assert info["true_objective"] == extra["true_objective"] == 1.0 and extra["progress"] == 1.0
    assert extra["unshaped_return"] == pytest.approx(-(1.0 + DEFAULT_PUSH_COST) * len(rewards))  # pushed every step

    env.reset(seed=1)
    _, _, _, _, info = env.step(1)
    assert "true_objective" not in info and "episode_extra_stats" not in info  # only at episode end


def test_declared_bounds_reach_pbt_and_keep_the_bonus_in_range():
    info = env_info("mountain_car_shaped")
    assert info.reward_shaping == {"velocity_bonus": DEFAULT_VELOCITY_BONUS}
    assert info.reward_shaping_bounds == {"velocity_bonus": (0.1, 10.0)}
    bounds = pbt.shaping_bounds(info.reward_shaping_bounds)
    settings = pbt.Settings(1000, 0, 0.3, 1.0, 0.1, 1e-6, 1.5, 4.0, bounds)
    rng = random.Random(0)
    values = [DEFAULT_VELOCITY_BONUS]
    for _ in range(300):  # a long random walk stays inside, and visits both ends
        values.append(pbt.explore({"velocity_bonus": values[-1]}, settings.shaping_bounds, rng, settings,
                                  pbt.SHAPING_BOUNDS)["velocity_bonus"])
    assert min(values) == 0.1 and max(values) == 10.0
    assert pbt.explore({"velocity_bonus": 0.0}, bounds, rng, settings)["velocity_bonus"] >= 0.1  # 0 moves up
