"""Atari games (ALE) with the standard DeepMind preprocessing, as `--env=atari_<game>`.

Why this module exists: published Atari results (DQN, A3C, IMPALA, APPO) all use the same preprocessing:
no-op starts, 4-frame skip with max-pooling, 84x84 grayscale, rewards clipped to their sign, 4 stacked frames,
and one "episode" per life. Matching it matters more than any trainer detail when comparing scores, so
the env is built here once, from gymnasium's own wrappers where they exist, instead of per experiment.

Wrapper order, innermost first, and why:

1. `TrueEpisodeReward` sits on the raw ALE env, so it sees every emulator frame's unclipped reward and the
   real game over, and puts the whole game's score in `info["true_episode_reward"]` when the game ends.
2. `gymnasium.wrappers.AtariPreprocessing`: no-op starts, frame skip 4 with max over the last two frames,
   84x84 grayscale uint8. Its `terminal_on_life_loss` is left off: a reset after it restarts the whole game,
   so the agent would only ever play its first life and no game would reach game over.
3. `EpisodicLife` (ours, when `episodic_life`): a lost life ends the episode, but the reset that follows
   continues the same game; only a real game over resets the emulator.
4. `FireReset` (ours, for games such as Breakout that wait for FIRE): presses FIRE after every reset,
   including the resets after a lost life.
5. `gymnasium.wrappers.TransformReward` with the reward's sign (when `clip_rewards`).
6. `gymnasium.wrappers.FrameStackObservation`: (4, 84, 84) uint8, stack axis first, never scaled.
7. `FramesPerStep`: tells the trainer that one env step is 4 emulator frames and that game scores
   come in `info`.

ale-py (>= 0.9 ships the ROMs) and OpenCV (used by AtariPreprocessing) are imported only inside
`make_atari`, so `import appo.envs.atari` works without them: `pip install -e ".[atari]"`.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from appo.envs.registry import EnvError

ATARI_PREFIX = "atari_"
FRAME_SKIP = 4
SCREEN_SIZE = 84
_INSTALL_HINT = 'pip install -e ".[atari]"'
# make_atari's options for one episode per whole game, scored unclipped: what training records (a game's
# info["true_episode_reward"]), for evaluation and enjoy (appo.envs.registry.whole_game_kwargs).
WHOLE_GAMES = {"episodic_life": False, "clip_rewards": False}


def is_atari_name(name: str) -> bool:
    """True for `--env` values such as atari_breakout, atari_pong, atari_space_invaders."""
    return name.startswith(ATARI_PREFIX) and len(name) > len(ATARI_PREFIX)


class TrueEpisodeReward(gym.Wrapper):
    """Sums unclipped rewards over the whole game (all lives); at game end puts the sum in
    `info["true_episode_reward"]`. A time-limit truncation by ALE also counts as a game end."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.total = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.total = 0.0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.total += float(reward)
        # The raw ALE env's `terminated` is ale.game_over(): life losses are only made terminal further out.
        if terminated or truncated:
            info = {**info, "true_episode_reward": self.total}
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """Ends the episode when a life is lost; the next reset goes on with the same game (one no-op step)
    and only resets the emulator after a real game over, or when a seed is given."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_ended = True

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_ended = terminated or truncated
        lives = self._ale_lives()
        # lives > 0: the last life lost is the game over itself, already terminal.
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.game_ended or seed is not None or options is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op itself ended the game
                obs, info = self.env.reset()
        self.game_ended = False
        self.lives = self._ale_lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE after reset, for games that stand still until it is pressed (Breakout)."""

    FIRE = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        for _ in range(3):  # FIRE ending the episode is near impossible; don't loop forever if it does
            obs, _, terminated, truncated, _ = self.env.step(self.FIRE)
            if not (terminated or truncated):
                break
            obs, info = self.env.reset()
        return obs, info


class FramesPerStep(gym.Wrapper):
    """Outermost wrapper: attributes the trainer reads (gymnasium >= 1.0 wrappers don't forward them)."""

    frames_per_step = FRAME_SKIP  # emulator frames per env step, for reporting frames/s
    reports_true_episode_reward = True  # game scores come in info["true_episode_reward"]


def _reward_sign(reward: SupportsFloat) -> float:
    return float(np.sign(reward))


def _ale_id(name: str) -> str:
    """`atari_space_invaders` -> `ALE/SpaceInvaders-v5`, matched against the ids ale-py registered."""
    game = name[len(ATARI_PREFIX):].replace("_", "").lower()
    ids = {env_id[len("ALE/"):-len("-v5")].lower(): env_id for env_id in gym.registry
           if env_id.startswith("ALE/") and env_id.endswith("-v5")}
    if not is_atari_name(name) or game not in ids:
        raise EnvError(f"--env={name}: unknown Atari game; use atari_<game> in snake case, "
                       f"e.g. atari_breakout, atari_pong, atari_space_invaders")
    return ids[game]


def make_atari(name: str, episodic_life: bool = True, clip_rewards: bool = True, noop_max: int = 30,
               frame_stack: int = 4, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Make `atari_<game>` with DeepMind preprocessing; observations are (frame_stack, 84, 84) uint8.

    `kwargs` go to `gymnasium.make` (e.g. `mode`, `difficulty`)."""
    try:
        import ale_py
    except ImportError as exc:
        raise EnvError(f"--env={name}: needs ale-py; install it with: {_INSTALL_HINT}") from exc
    try:
        import cv2  # noqa: F401  (AtariPreprocessing resizes with OpenCV)
    except ImportError as exc:
        raise EnvError(f"--env={name}: needs opencv-python-headless; install it with: {_INSTALL_HINT}") from exc
    gym.register_envs(ale_py)

    # Sticky actions off and the minimal action set, as in the DeepMind setup; frame skip is done below.
    env = gym.make(_ale_id(name), frameskip=1, repeat_action_probability=0.0, full_action_space=False,
                   render_mode=render_mode, disable_env_checker=True, **kwargs)
    env = TrueEpisodeReward(env)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
                                          terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    if episodic_life:
        env = EpisodicLife(env)
    meanings = env.unwrapped.get_action_meanings()
    if len(meanings) > 1 and meanings[1] == "FIRE":
        env = FireReset(env)
    if clip_rewards:
        env = gym.wrappers.TransformReward(env, _reward_sign)
    env = gym.wrappers.FrameStackObservation(env, frame_stack)
    return FramesPerStep(env)
