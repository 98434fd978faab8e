"""`appo.envs.atari`: DeepMind preprocessing on ALE games, episode-per-life handling and the true game score."""

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ale_py")

from appo.envs.atari import ATARI_PREFIX, is_atari_name, make_atari  # noqa: E402
from appo.envs.registry import EnvError, make_env  # noqa: E402
from tests.conftest import REPO  # noqa: E402


def random_steps(env, seed: int, max_steps: int):
    """Yield (obs, reward, terminated, truncated, info) for seeded random actions, without resetting."""
    env.action_space.seed(seed)
    for _ in range(max_steps):
        yield env.step(env.action_space.sample())


def play_until_done(env, seed: int, max_steps: int = 5000) -> tuple[float, bool, bool, dict]:
    """Random play until the episode ends: (summed reward, terminated, truncated, last info)."""
    total = 0.0
    for _, reward, terminated, truncated, info in random_steps(env, seed, max_steps):
        total += float(reward)
        if terminated or truncated:
            return total, terminated, truncated, info
    raise AssertionError(f"no episode end in {max_steps} random steps")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_names():
    assert ATARI_PREFIX == "atari_"
    assert all(map(is_atari_name, ["atari_breakout", "atari_pong", "atari_space_invaders"]))
    assert not any(map(is_atari_name, ["CartPole-v1", "atari_", "breakout", "ALE/Breakout-v5"]))


@pytest.mark.timeout(60)
def test_observation_is_stacked_uint8_frames():
    env = make_atari("atari_breakout")
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    obs, *_ = env.step(0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert obs in env.observation_space
    assert env.frames_per_step == 4
    env.close()


@pytest.mark.timeout(60)
def test_frame_stack_shifts_by_one_frame_per_step():
    env = make_atari("atari_breakout")
    prev, _ = env.reset(seed=1)
    assert all(np.array_equal(prev[0], frame) for frame in prev)  # padded with the reset frame
    changed = False
    for obs, _, terminated, truncated, _ in random_steps(env, seed=1, max_steps=50):
        if terminated or truncated:
            break
        assert np.array_equal(obs[:-1], prev[1:])
        changed |= not np.array_equal(obs[-1], prev[-1])
        prev = obs
    assert changed  # the newest frame is really new
    env.close()


@pytest.mark.timeout(60)
def test_noop_starts_vary_the_first_observation():
    def first_observations(noop_max: int) -> set[bytes]:
        env = make_atari("atari_breakout", noop_max=noop_max)
        firsts = {env.reset(seed=seed)[0].tobytes() for seed in range(5)}
        env.close()
        return firsts

    assert len(first_observations(30)) >= 2
    assert len(first_observations(0)) == 1  # without no-ops the emulator is deterministic


@pytest.mark.timeout(60)
def test_episodic_life_ends_the_episode_on_a_lost_life():
    env = make_atari("atari_breakout", episodic_life=True)
    env.reset(seed=2)
    ale = env.unwrapped.ale
    lives = ale.lives()
    _, terminated, truncated, info = play_until_done(env, seed=2)
    assert terminated and not truncated
    assert 0 < ale.lives() < lives and not ale.game_over()
    assert "true_episode_reward" not in info
    # The next reset goes on with the same game instead of restarting it.
    env.reset()
    assert ale.lives() == lives - 1
    env.close()


@pytest.mark.timeout(60)
def test_without_episodic_life_only_game_over_terminates():
    env = make_atari("atari_breakout", episodic_life=False)
    env.reset(seed=3)
    ale = env.unwrapped.ale
    _, terminated, truncated, _ = play_until_done(env, seed=3)
    assert terminated and not truncated
    assert ale.game_over() and ale.lives() == 0
    env.close()


@pytest.mark.timeout(60)
def test_rewards_are_clipped_to_their_sign():
    # Space Invaders scores 5 to 30 points per invader: clipping is visible. Same seed and actions, so the
    # clipped run replays the unclipped one.
    runs = {}
    for clip in (False, True):
        env = make_atari("atari_space_invaders", clip_rewards=clip)
        env.reset(seed=4)
        runs[clip] = [step[1] for step in random_steps(env, seed=4, max_steps=300)]
        env.close()
    raw, clipped = np.array(runs[False]), np.array(runs[True])
    assert raw.max() > 1
    assert set(np.unique(clipped)) <= {-1.0, 0.0, 1.0}
    np.testing.assert_array_equal(clipped, np.sign(raw))


@pytest.mark.timeout(60)
def test_true_episode_reward_is_the_whole_game_score():
    env = make_atari("atari_breakout", episodic_life=True, clip_rewards=False)
    env.reset(seed=5)
    ale = env.unwrapped.ale
    life_episodes, score = 0, 0.0
    for _ in range(10):  # Breakout has 5 lives
        reward, terminated, truncated, info = play_until_done(env, seed=5 + life_episodes)
        assert terminated and not truncated
        score += reward
        life_episodes += 1
        if "true_episode_reward" in info:
            break
        env.reset()
    assert ale.game_over() and life_episodes == 5
    assert info["true_episode_reward"] == pytest.approx(score)
    # A new game starts from zero.
    env.reset()
    _, terminated, _, info = play_until_done(env, seed=6)
    assert terminated and "true_episode_reward" not in info
    env.close()


@pytest.mark.timeout(60)
def test_env_exposes_what_the_trainer_reads():
    env = make_atari("atari_pong")
    assert env.frames_per_step == 4
    assert env.reports_true_episode_reward
    assert env.observation_space.shape == (4, 84, 84)
    env.close()


def test_gymnasium_ale_ids_are_made_as_they_are(monkeypatch):
    """`ALE/Pong-v5` is gymnasium's raw env (RGB frames, its own frame skip), once ale-py has registered its ids."""
    env = make_env("ALE/Pong-v5")
    assert env.observation_space.shape == (210, 160, 3) and env.action_space.n == 6
    env.close()
    monkeypatch.setitem(sys.modules, "ale_py", None)
    with pytest.raises(EnvError, match=r"--env=ALE/Breakout-v5: the ALE ids need ale_py; pip install -e \"\.\[atari"):
        make_env("ALE/Breakout-v5")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_unknown_game_names_the_valid_form():
    for name in ("atari_no_such_game", "atari_"):
        with pytest.raises(EnvError, match=r"atari_<game>.*atari_breakout"):
            make_atari(name)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_missing_ale_py_names_the_flag_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # makes `import ale_py` raise ImportError
    with pytest.raises(EnvError, match=r"--env=atari_breakout: needs ale-py.*pip install -e \"\.\[atari\]\""):
        make_atari("atari_breakout")


@pytest.mark.timeout(60)
def test_import_does_not_load_ale_py():
    code = "import sys, appo.envs.atari; assert 'ale_py' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
