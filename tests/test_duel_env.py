"""The built-in two-player duel: API shapes, zero-sum rewards, scoring on a miss, mirrored observations,
rendering, determinism, and the scripted opponent's documented strength (no training here)."""

import time

import gymnasium as gym
import numpy as np
import pytest

from appo.envs import make_env
from appo.envs.duel import DOWN, STAY, UP, DuelEnv, aiming_action, evaluate, make_duel_env, scripted_action


def place(env: DuelEnv, bx: float, by: float, vx: float, vy: float, p0: float, p1: float) -> None:
    """Put the game in a given position (the ball's speed follows its velocity)."""
    env.bx, env.by, env.vx, env.vy = bx, by, vx, vy
    env.speed = float(np.hypot(vx, vy))
    env.paddles = [p0, p1]


@pytest.mark.timeout(30)
def test_make_returns_new_env_with_per_agent_spaces():
    env, other = make_duel_env(), make_env("duel")
    assert env is not other and isinstance(env, gym.Env) and isinstance(other, DuelEnv)
    assert env.num_agents == 2
    assert isinstance(env.observation_space, gym.spaces.Box) and env.observation_space.dtype == np.float32
    assert env.observation_space.shape == (6,)
    assert isinstance(env.action_space, gym.spaces.Discrete) and env.action_space.n == 3
    assert make_duel_env(points_to_win=5).rules.points_to_win == 5
    with pytest.raises(ValueError, match="unknown"):
        make_duel_env(paddle_size=0.3)
    with pytest.raises(ValueError):
        make_duel_env(max_ball_speed=0.7)


@pytest.mark.timeout(30)
def test_reset_and_step_shapes_and_dtypes():
    env = make_duel_env()
    obs, info = env.reset(seed=0)
    assert isinstance(info, dict)
    assert obs.shape == (2, 6) and obs.dtype == np.float32
    assert all(env.observation_space.contains(o) for o in obs)
    obs, rewards, terminated, truncated, info = env.step(np.array([DOWN, UP]))
    assert obs.shape == (2, 6) and obs.dtype == np.float32
    assert rewards.shape == (2,) and rewards.dtype == np.float32
    assert isinstance(terminated, bool) and isinstance(truncated, bool) and isinstance(info, dict)
    env.step([STAY, STAY])  # a list works too
    with pytest.raises(ValueError):
        env.step(np.array([1, 3]))
    with pytest.raises(ValueError):
        env.step(np.array([1, 1, 1]))


@pytest.mark.timeout(30)
def test_rewards_zero_sum_every_step_and_games_end_with_scores():
    env = make_duel_env()
    rng = np.random.default_rng(0)
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        totals, done = np.zeros(2), False
        while not done:
            actions = [scripted_action(obs[0]), int(rng.integers(3))]
            obs, rewards, terminated, truncated, info = env.step(actions)
            assert rewards.sum() == 0.0 and set(rewards.tolist()) <= {-1.0, 0.0, 1.0}
            assert all(env.observation_space.contains(o) for o in obs)
            totals += rewards
            done = terminated or truncated
        stats = info["episode_extra_stats"]
        assert totals[0] == stats["score_0"] - stats["score_1"] == -totals[1]
        assert terminated == (max(stats["score_0"], stats["score_1"]) == env.rules.points_to_win)
        assert info["winner"] == (0 if stats["score_0"] > stats["score_1"] else 1)


@pytest.mark.timeout(30)
def test_a_miss_scores_a_point_and_a_hit_returns_the_ball():
    env = make_duel_env()
    env.reset(seed=0)
    # The ball reaches the left goal line at y = 0.3 while agent 0's paddle covers [0.7, 0.9]: agent 1 scores.
    place(env, 0.02, 0.3, -0.04, 0.0, 0.8, 0.5)
    obs, rewards, _, _, _ = env.step([STAY, STAY])
    assert rewards.tolist() == [-1.0, 1.0] and env.scores == [0, 1]
    assert (env.bx, env.by) == (0.5, 0.5)  # served again from the centre
    # The same ball on the right goal line, paddle elsewhere: agent 0 scores.
    place(env, 0.98, 0.3, 0.04, 0.0, 0.5, 0.8)
    _, rewards, _, _, _ = env.step([STAY, STAY])
    assert rewards.tolist() == [1.0, -1.0] and env.scores == [1, 1]
    # A centre hit returns the ball flat, an edge hit steeply, faster each time.
    place(env, 0.02, 0.5, -0.04, 0.0, 0.5, 0.5)
    _, rewards, _, _, _ = env.step([STAY, STAY])
    assert rewards.tolist() == [0.0, 0.0] and env.vx > 0.04 and env.vy == 0.0
    place(env, 0.98, 0.59, 0.04, 0.0, 0.5, 0.5)
    env.step([STAY, STAY])
    assert env.vx < 0.0 and env.vy > 1.5 * abs(env.vx)  # near the top edge (63 degrees): steeply up


@pytest.mark.timeout(30)
def test_mirrored_positions_give_the_seats_swapped_observations():
    env, mirror = make_duel_env(), make_duel_env()
    env.reset(seed=0)
    mirror.reset(seed=0)
    rng = np.random.default_rng(1)
    for _ in range(50):
        bx, by, p0, p1 = rng.uniform(0.1, 0.9, size=4)
        vx, vy = rng.uniform(-0.05, 0.05, size=2)
        place(env, bx, by, vx, vy, p0, p1)
        place(mirror, 1.0 - bx, by, -vx, vy, p1, p0)
        obs, mirrored = env._obs(), mirror._obs()
        np.testing.assert_array_equal(obs[0], mirrored[1])
        np.testing.assert_array_equal(obs[1], mirrored[0])
        # The dynamics are mirrored too: swapped actions give swapped observations and rewards.
        actions = rng.integers(0, 3, size=2)
        obs, rewards, _, _, _ = env.step(actions)
        mirrored, mirrored_rewards, _, _, _ = mirror.step(actions[::-1])
        if rewards[0] == 0.0:  # (a serve after a point draws a random direction)
            np.testing.assert_allclose(obs, mirrored[::-1], atol=1e-6)
        np.testing.assert_array_equal(rewards, mirrored_rewards[::-1])


@pytest.mark.timeout(30)
def test_render_returns_an_rgb_frame():
    env = make_duel_env(render_mode="rgb_array")
    assert "rgb_array" in env.metadata["render_modes"] and env.metadata["render_fps"] > 0
    env.reset(seed=0)
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    env.scores = [2, 1]
    assert not np.array_equal(env.render(), frame)  # the score shows
    assert make_duel_env().render() is None
    with pytest.raises(ValueError):
        make_duel_env(render_mode="human")


@pytest.mark.timeout(30)
def test_scripted_action_works_from_either_seat():
    env = make_duel_env()
    env.reset(seed=0)
    # The ball comes towards agent 0 high up: agent 0 moves up; agent 1 (ball going away, paddle low) recentres.
    place(env, 0.5, 0.9, -0.04, 0.0, 0.5, 0.2)
    obs = env._obs()
    assert scripted_action(obs[0]) == UP and scripted_action(obs[1]) == UP
    # The mirror image: now agent 1 chases the ball, agent 0 recentres from its high paddle.
    place(env, 0.5, 0.1, 0.04, 0.0, 0.8, 0.5)
    obs = env._obs()
    assert scripted_action(obs[1]) == DOWN and scripted_action(obs[0]) == DOWN
    # Within its dead zone it stays.
    place(env, 0.5, 0.52, 0.04, 0.0, 0.5, 0.5)
    assert scripted_action(env._obs()[1]) == STAY


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_random_play_loses_and_aiming_beats_the_scripted_opponent():
    rng = np.random.default_rng(0)
    random_play = evaluate(lambda obs: rng.integers(0, 3, size=len(obs)), games=40)
    assert random_play["games"] == 40 and random_play["wins"] + random_play["draws"] + random_play["losses"] == 40
    assert random_play["win_rate"] <= 0.05  # documented: 1.0% over 1000 games
    scripted = evaluate(lambda obs: [scripted_action(o) for o in obs], games=40)
    assert 0.25 <= scripted["win_rate"] <= 0.75  # documented: 51.5%
    aiming = evaluate(lambda obs: [aiming_action(o) for o in obs], games=40)
    assert aiming["win_rate"] >= 0.8  # documented: 98.5%


@pytest.mark.timeout(30)
def test_deterministic_given_seed_and_actions():
    actions = np.random.default_rng(123).integers(0, 3, size=(300, 2))

    def rollout(seed: int) -> list[np.ndarray]:
        env = make_duel_env()
        out = [env.reset(seed=seed)[0]]
        for a in actions:
            obs, rewards, terminated, truncated, _ = env.step(a)
            out += [obs, rewards]
            if terminated or truncated:
                out.append(env.reset()[0])
        return out

    first, again, other = rollout(7), rollout(7), rollout(8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.timeout(30)
def test_truncated_at_max_steps_is_a_draw_when_tied():
    env = make_duel_env(max_steps=5)
    env.reset(seed=0)
    for t in range(1, 6):
        _, _, terminated, truncated, info = env.step([STAY, STAY])
        assert not terminated and truncated == (t == 5)
    assert info["winner"] == -1 and info["episode_extra_stats"]["draw"] == 1.0


@pytest.mark.timeout(30)
def test_step_is_fast():
    env = make_duel_env()
    env.reset(seed=0)
    actions = np.array([UP, DOWN])
    start = time.perf_counter()
    for _ in range(20_000):
        _, _, terminated, truncated, _ = env.step(actions)
        if terminated or truncated:
            env.reset()
    per_step = (time.perf_counter() - start) / 20_000
    assert per_step < 50e-6, f"{per_step * 1e6:.1f} us per step"
