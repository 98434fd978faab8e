"""The Catch image env: its spaces, rewards, seeding and episode length, and how well random and perfect play do."""

import numpy as np
import pytest

from appo.envs import make_env
from appo.envs.catch import LEFT, ON, RIGHT, STAY, CatchEnv


def toward_ball(env: CatchEnv) -> int:
    """The move that brings the paddle under the ball (a perfect player)."""
    return STAY if env.paddle == env.ball_column else RIGHT if env.ball_column > env.paddle else LEFT


def away_from_ball(env: CatchEnv) -> int:
    """Toward the wall farther from the ball's column, which the paddle reaches before the ball lands."""
    return RIGHT if env.ball_column < env.columns / 2 else LEFT


def play(env: CatchEnv, choose, seed: int) -> tuple[float, int, dict]:
    """One episode: its return, its length and the last step's info."""
    env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(choose(env))
        total, steps = total + reward, steps + 1
        if terminated or truncated:
            return total, steps, info


def test_registered_with_image_spaces():
    env = make_env("catch")
    obs, _ = env.reset(seed=0)
    assert isinstance(env, CatchEnv)
    assert env.observation_space.shape == (10, 5, 1) and env.observation_space.dtype == np.uint8
    assert env.action_space.n == 3
    assert obs in env.observation_space
    assert np.count_nonzero(obs) == 2 and obs[9, 2, 0] == ON and obs[0, env.ball_column, 0] == ON


def test_a_caught_ball_gives_plus_one_and_a_missed_one_minus_one():
    env = CatchEnv()
    for choose, expected in ((toward_ball, 1.0), (away_from_ball, -1.0)):
        env.reset(seed=3)
        rewards = [env.step(choose(env))[1] for _ in range(env.rows - 1)]
        assert rewards == [0.0] * (env.rows - 2) + [expected]
        assert env.ball_row == 0 and env.balls_left == env.balls - 1  # the next ball is in the top row


def test_perfect_play_catches_every_ball_and_episodes_last_balls_times_the_fall():
    env = CatchEnv(rows=6, columns=6, balls=7)  # the widest row on which every ball is still reachable
    total, steps, info = play(env, toward_ball, seed=1)
    assert total == 7.0 and steps == 7 * 5
    assert info["episode_extra_stats"] == {"catch_rate": 1.0}
    total, steps, info = play(env, away_from_ball, seed=1)
    assert total == -7.0 and steps == 7 * 5 and info["episode_extra_stats"] == {"catch_rate": 0.0}


def test_seeding_repeats_the_balls():
    def columns(seed: int) -> list[int]:
        env = CatchEnv()
        env.reset(seed=seed)
        seen = []
        for _ in range(env.balls * (env.rows - 1) - 1):
            env.step(STAY)
            if env.ball_row == 0:
                seen.append(env.ball_column)
        return seen

    assert len(columns(5)) == 9
    assert columns(5) == columns(5)
    assert columns(5) != columns(6)


def test_random_play_is_far_below_a_learned_policy():
    """Random actions catch about a fifth of the balls (a mean return near -6, rarely above 0 in one episode), so
    the benchmark's threshold (scripts/pbt_suite.py) takes learning."""
    env = CatchEnv()
    rng = np.random.default_rng(0)
    returns = [play(env, lambda _: int(rng.integers(3)), seed)[0] for seed in range(300)]
    assert np.mean(returns) == pytest.approx(-6.0, abs=0.5)
    assert np.percentile(returns, 99) <= 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rows >= 2"):
        CatchEnv(rows=1)
    with pytest.raises(ValueError, match="expected 0"):
        CatchEnv().step(3)
