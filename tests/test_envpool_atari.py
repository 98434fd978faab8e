"""EnvPool Atari (`envpool:Breakout-v5`) with `atari_`'s preprocessing and game scores (envs/vector.py).

Checked: the observation and action spaces equal atari_breakout's and `--env_kwargs` override the defaults; on a
seeded pool played with random actions, a plain loop over EnvPool's own per-step info (unclipped reward, lives) finds
every game, and the episode tracker, fed as an actor feeds it, records exactly those games (score, length), once
each, while a lost life ends an episode (terminated) and records nothing; the per-env API goes on with the game after
a lost life; a short in-process training run reports whole games, and evaluation and enjoy score the same whole
games, unclipped."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector.utils import batch_space

pytest.importorskip("envpool")
pytest.importorskip("ale_py")

from appo.envs import make_env  # noqa: E402
from appo.envs.atari import make_atari  # noqa: E402
from appo.envs.registry import env_info  # noqa: E402
from appo.envs.vector import EnvPoolEnv, EnvPoolSameStep, last_step_info, make_vector_env  # noqa: E402
from appo.learning.trained_policy import episode_env_kwargs, load_policy, play  # noqa: E402
from appo.sampling.episodes import EpisodeTracker  # noqa: E402
from tests.test_batched_sampling import make_context  # noqa: E402

pytestmark = pytest.mark.slow  # every test here starts a trainer or trains

BREAKOUT = "envpool:Breakout-v5"
LIVES = 5  # Breakout's


@pytest.mark.timeout(60)
def test_spaces_and_options_match_atari_breakout_and_env_kwargs_override_them():
    atari = make_atari("atari_breakout")
    info = env_info(BREAKOUT)
    assert info.obs_space == atari.observation_space  # Box(0, 255, (4, 84, 84), uint8)
    assert info.action_space == atari.action_space  # the minimal action set
    assert info.frames_per_step == atari.frames_per_step == 4
    atari.close()
    env = make_vector_env(BREAKOUT, 2, seed=0)
    assert isinstance(env, EnvPoolSameStep) and env.reports_true_episode_reward
    config = env.env.config
    assert (config["episodic_life"], config["reward_clip"], config["use_fire_reset"], config["noop_max"]) == \
        (True, True, True, 30)
    assert (config["repeat_action_probability"], config["full_action_space"], config["max_episode_steps"]) == \
        (0.0, False, 27000)
    env.close()
    env = make_vector_env(BREAKOUT, 1, {"episodic_life": False, "frame_skip": 2}, seed=0)
    assert (env.env.config["episodic_life"], env.env.config["max_episode_steps"], env.frames_per_step) == \
        (False, 54000, 2)
    env.close()
    cartpole = make_vector_env("envpool:CartPole-v1", 1, seed=0)
    assert not cartpole.reports_true_episode_reward
    cartpole.close()


@pytest.mark.timeout(60)
def test_the_tracker_records_each_game_once_with_its_unclipped_score_and_lives_record_nothing():
    ctx = make_context(f"--env={BREAKOUT}")  # 2 splits of 8 sub-envs; split 0 is fed here as an actor feeds it
    n = ctx.layout.agents_per_split
    env = make_vector_env(BREAKOUT, n, seed=7)
    tracker = EpisodeTracker(ctx, 0, batched=True)
    slots = ctx.control.actors.cur_slot[0, 0]
    env.reset()
    actions = batch_space(env.single_action_space, n)
    actions.seed(7)
    score, length, lives = np.zeros(n), np.zeros(n, np.int64), np.full(n, LIVES)
    games, life_losses = [], 0
    for t in range(700):
        _, rewards, terminated, truncated, info = env.step(actions.sample())
        tracker.add_reward_array(0, rewards)
        assert np.array_equal(rewards, np.sign(info["reward"]))  # the clipped reward of EnvPool's unclipped one
        ended = np.flatnonzero(terminated | truncated).tolist()
        tracker.end_sub_envs(0, ended, [last_step_info(info, i) for i in ended], [env] * n, slots, t)
        # The reference: a plain loop over EnvPool's own per-step info, a game ending when its last life is lost.
        for i in range(n):
            score[i] += info["reward"][i]
            length[i] += 1
            game_over = info["lives"][i] == 0 or truncated[i]
            if info["lives"][i] < lives[i] and not game_over:
                life_losses += 1
                assert terminated[i] and "true_episode_reward" not in last_step_info(info, i)
            if game_over:
                assert terminated[i] or truncated[i]
                games.append((float(score[i]), int(length[i])))
                score[i], length[i] = 0.0, 0
                lives[i] = LIVES
            else:
                lives[i] = info["lives"][i]
    recorded = [(e.reward, e.length) for e in tracker.take()[0]]
    assert len(games) >= 8 and life_losses >= 4 * len(games)
    assert sorted(recorded) == sorted(games)
    assert any(s > 0 for s, _ in games)
    env.close()


@pytest.mark.timeout(60)
def test_the_per_env_api_goes_on_with_the_game_after_a_lost_life():
    env = make_env(BREAKOUT, {"seed": 3})
    assert isinstance(env, EnvPoolEnv) and env.reports_true_episode_reward and env.frames_per_step == 4
    env.action_space.seed(3)
    env.reset()
    lives_seen, score, game_score = [], 0.0, None
    while game_score is None:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        score += info["reward"]
        if terminated or truncated:
            lives_seen.append(int(info["lives"]))
            game_score = info.get("true_episode_reward")
            first, reset_info = env.reset()
            assert first.shape == (4, 84, 84)
    assert lives_seen == [4, 3, 2, 1, 0] and game_score == score
    env.close()


@pytest.mark.timeout(60)
def test_a_training_run_reports_whole_games(tmp_path):
    from appo import train
    from appo.hooks import Hooks

    episodes = []
    train(env=BREAKOUT, experiment="envpool_atari", train_dir=str(tmp_path), serial_mode=True, seed=1, num_workers=1,
          worker_num_splits=1, num_envs_per_worker=8, rollout=32, batch_size=256, num_batches_per_iteration=1,
          train_for_env_steps=2500, decorrelate_envs_on_one_worker=False,
          hooks=Hooks(on_episode_end=[episodes.append]))
    assert episodes
    # A random Breakout life lasts about 36 steps, a game 5 of them (180, at least 116 in 30 games); a score is a
    # whole number of points.
    assert all(e.length >= 80 and e.reward == int(e.reward) >= 0 for e in episodes), episodes


class TrainingScores(gym.Wrapper):
    """Keeps, at every episode end, the score training records of it: the game's info["true_episode_reward"], None
    for an episode that is not a whole game (a lost life, which training does not record)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.scores: list[float | None] = []

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            self.scores.append(info.get("true_episode_reward"))
        return obs, reward, terminated, truncated, info


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_id", [BREAKOUT, "envpool:SpaceInvaders-v5", "atari_space_invaders"])
def test_evaluation_and_enjoy_score_the_whole_unclipped_games_training_records(tmp_path, env_id):
    """The evaluator (and so best.pth) and enjoy play the envs `episode_env_kwargs` makes of the run's flags: each
    episode is a whole game whose return is its unclipped score, as training records it. A fresh policy, sampled,
    plays; in Space Invaders every point scored is 5 or more, so a clipped return would fall short."""
    from tests.test_after_training import make_experiment

    policy = load_policy(make_experiment(tmp_path, "scored", f"--env={env_id}"))
    envs = [TrainingScores(make_env(env_id, episode_env_kwargs(policy.cfg))) for _ in range(2)]
    episodes = play(policy, envs, 4, deterministic=False, max_frames=20_000, seed=0, log_episodes=False)
    scores = [score for env in envs for score in env.scores]
    assert len(episodes) == 4 and None not in scores
    assert sorted(e.reward for e in episodes) == sorted(scores)
    for env in envs:
        env.close()
