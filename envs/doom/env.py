"""`DoomEnv`: one ViZDoom game as a gymnasium env, the conventions of Sample Factory's Doom setup as defaults.

- Observations: {"obs": the screen, uint8 [3, 72, 128] (rendered at 160x120, resized), "measurements": float32
  numbers about the player (health, ammunition, ... scaled to about 0-1: MEASUREMENTS)}; the trainer's model
  gives each key its own encoder (a CNN for the screen, an MLP for the numbers).
- Actions: MultiDiscrete, one choice per group of buttons that exclude each other (envs/doom/actions.py).
- One step is `frame_skip` = 4 tics done by the engine itself (`make_action(buttons, tics)`): only the last tic is
  rendered. Use frame_skip=1 to watch every tic (`appo.enjoy` does, repeating each action 4 times).
- The engine starts in a thread as soon as the env is made (about 0.1-0.2 s; a worker's envs start theirs
  together) and the first reset waits for it. A reset starts a new episode in the same engine (`new_episode`:
  about a millisecond), never a new engine. The trainer's `--decorrelate_envs_on_one_worker` (random steps after
  the first reset) keeps a worker's envs from ending their episodes in step.
- Hosted deathmatch maps (cig, multi_duel, multi_deathmatch): the env hosts the game (on a UDP port leased until
  close(), `game.lease_port`) and adds `num_bots` built-in bots (`bot_skill`: 0-100, the bots of bots.cfg nearest
  that strength; None: Doom's random pick) every episode; the agent respawns as soon as it dies; the reward is
  shaped (envs/doom/shaping.py) and PBT may change it; the last step's info has the episode's frags, deaths, frag
  difference and damage as `episode_extra_stats` and its frags as `true_objective`. Episodes end at `episode_tics`
  (a truncation: the match's time is up).
"""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np

from appo.envs.doom import shaping
from appo.envs.doom.actions import FULL_BUTTONS, ActionSet
from appo.envs.doom.game import (
    Network,
    add_bots,
    bot_names,
    cfg_buttons,
    lease_port,
    new_game,
    opponent_frags,
    release_port,
)
from appo.envs.doom.scenarios import Scenario

FRAME_SKIP = 4
# An engine's /dev/shm entries: a 10.7 MB segment sized for the largest screen, of which a 160x120 game writes
# (so tmpfs counts) about 96 KB, measured here (10 games in a 2 MB tmpfs used 960 KB); rounded up.
SHM_BYTES_PER_GAME = 128 * 2**10
OBS_WIDTH, OBS_HEIGHT = 128, 72
# game variable -> its scale in the measurements vector
MEASUREMENTS = {"HEALTH": 100.0, "SELECTED_WEAPON_AMMO": 50.0}
DEATHMATCH_MEASUREMENTS = {"HEALTH": 100.0, "ARMOR": 100.0, "SELECTED_WEAPON": 7.0, "SELECTED_WEAPON_AMMO": 50.0,
                           **{name: 1.0 for name in shaping.WEAPONS}, **shaping.AMMO_CAPACITY}


class DoomEnv(shaping.ShapedReward, gym.Env):
    """One ViZDoom scenario; see the module docstring. The engine starts at the first reset."""

    metadata = {"render_modes": ["rgb_array", "rgb_array_list"], "render_fps": 35}
    shm_bytes_per_env = SHM_BYTES_PER_GAME

    def __init__(self, name: str, scenario: Scenario, frame_skip: int = FRAME_SKIP, num_bots: int | None = None,
                 bot_skill: float | None = None, episode_tics: int | None = None,
                 reward_shaping: dict[str, float] | None = None, render_mode: str | None = None):
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode={render_mode!r}: one of {self.metadata['render_modes']} (or None)")
        if frame_skip < 1:
            raise ValueError(f"frame_skip={frame_skip}: must be at least 1")
        self.name, self.scenario, self.render_mode = name, scenario, render_mode
        self.frames_per_step = frame_skip  # emulator frames per env step, for frames/s
        self.hosted = self.shaped = scenario.bots > 0
        self.bots = bot_names(scenario.bots if num_bots is None else num_bots, bot_skill) if self.hosted else []
        self.episode_tics = episode_tics or scenario.timeout_tics
        measurements = DEATHMATCH_MEASUREMENTS if self.hosted or scenario.full_actions else MEASUREMENTS
        self._scales = np.array(list(measurements.values()), dtype=np.float32)
        self._variables, self._counter_index = (shaping.with_counters(tuple(measurements)) if self.hosted
                                                else (tuple(measurements), np.zeros(0, dtype=np.int64)))
        self._variable_ids: list[Any] = []  # the engine's GameVariable of each of self._variables
        self._buttons = list(FULL_BUTTONS) if scenario.full_actions else None
        self.actions: ActionSet | None = None if self._buttons is None else ActionSet(self._buttons)
        self.shaping = dict(shaping.DEFAULTS, **(reward_shaping or {}))
        self.game: Any = None
        self.port: int | None = None  # a hosted game's UDP port, leased until close()
        self._start_error: BaseException | None = None
        self._screen = np.zeros((3, OBS_HEIGHT, OBS_WIDTH), dtype=np.uint8)
        self._frame: np.ndarray | None = None
        self._frames: list[np.ndarray] = []  # rgb_array_list: the tics since the last render()
        if self.actions is None:  # the .cfg's buttons: read them without starting the engine
            self._buttons = cfg_buttons(name, scenario.cfg)
            self.actions = ActionSet(self._buttons)
        self.action_space = self.actions.space
        self.observation_space = gym.spaces.Dict({
            "obs": gym.spaces.Box(0, 255, (3, OBS_HEIGHT, OBS_WIDTH), np.uint8),
            "measurements": gym.spaces.Box(-np.inf, np.inf, (len(self._scales),), np.float32)})
        self._starting = threading.Thread(target=self._start, name=f"{name} engine start", daemon=True)
        self._starting.start()

    def _start(self) -> None:
        try:
            network = None
            if self.hosted:  # two games with bots started together must not host on the same port
                self.port = lease_port()
                network = Network(self.port, players=1)
            game = new_game(self.name, self.scenario.cfg, self._buttons, self._variables,
                            episode_tics=self.episode_tics, network=network)
            game.init()
            self._variable_ids = list(game.get_available_game_variables())
            self.game = game
        except BaseException as exc:  # raised again by the first reset, in the worker's thread
            self._start_error = exc

    def _wait_for_engine(self) -> None:
        if self._starting.is_alive() or self.game is None:
            self._starting.join()
            if self._start_error is not None:
                raise self._start_error

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._wait_for_engine()
        if seed is not None:
            self.game.set_seed(seed % 2**31)
        self.game.new_episode()
        if self.hosted:
            add_bots(self.game, self.bots)
        obs = self._observe()
        self._frames = [self._frame] if self.render_mode == "rgb_array_list" else []
        self._counters = self._episode_start = self._variables_now[self._counter_index]
        self._opponents_start = opponent_frags(self.game) if self.hosted else None
        return obs, {}

    def step(self, action):
        buttons = self.actions.to_buttons(action)
        if self.render_mode == "rgb_array_list":
            reward = self._play_every_tic(buttons)
        else:
            reward = self.game.make_action(buttons, self.frames_per_step)
        finished = self.game.is_episode_finished()
        info: dict[str, Any] = {}
        if self.hosted and not finished and self.game.is_player_dead():
            self.game.respawn_player()
        obs = self._observe() if not finished else self._last_obs()
        if self.hosted:
            counters = self._variables_now[self._counter_index]
            reward = shaping.shaped_reward(self._counters, counters, self.shaping)
            self._counters = counters
            if finished:
                stats = shaping.match_stats(self._episode_start, counters,
                                            opponent_frags(self.game) - self._opponents_start)
                info = {"episode_extra_stats": stats, "true_objective": stats["frags"]}
        truncated = finished and self.game.is_episode_timeout_reached()
        return obs, float(reward), finished and not truncated, truncated, info

    def _play_every_tic(self, buttons: list[float]) -> float:
        """The step tic by tic (frame skip 1, the action held), keeping every tic's screen for render()."""
        reward = 0.0
        for _ in range(self.frames_per_step):
            reward += self.game.make_action(buttons, 1)
            if self.game.is_episode_finished():
                break
            self._frames.append(self.game.get_state().screen_buffer)
        return reward

    def _observe(self) -> dict[str, np.ndarray]:
        state = self.game.get_state()
        if state is None:  # a hosted game between death and respawn now and then has no state for a step
            return self._last_obs()
        self._frame = state.screen_buffer  # [120, 160, 3]
        self._screen = screen_observation(self._frame)
        self._variables_now = np.asarray(state.game_variables, dtype=np.float64)
        self._measurements = (self._variables_now[:len(self._scales)] / self._scales).astype(np.float32)
        return {"obs": self._screen, "measurements": self._measurements}

    def _last_obs(self) -> dict[str, np.ndarray]:
        """The observation of an episode's last step (the engine has no state then): the last screen, with the
        game variables read one by one."""
        self._variables_now = np.array([self.game.get_game_variable(v) for v in self._variable_ids])
        return {"obs": self._screen, "measurements": self._measurements}

    def render(self) -> np.ndarray | list[np.ndarray] | None:
        """The screen at the resolution the game renders (160x120 RGB), not the policy's 128x72: the last one
        ("rgb_array"), or every tic's since the last call ("rgb_array_list", gymnasium's convention)."""
        if self.render_mode == "rgb_array_list":
            frames, self._frames = self._frames, []
            return frames
        return None if self.render_mode != "rgb_array" or self._frame is None else self._frame

    def close(self) -> None:
        self._starting.join()
        if self.game is not None:
            self.game.close()
            self.game = None
        if self.port is not None:
            release_port(self.port)
            self.port = None


def screen_observation(frame: np.ndarray) -> np.ndarray:
    """The policy's view of a rendered screen: [120, 160, 3] RGB resized to [3, 72, 128] (linear interpolation:
    13 us a frame here, against 58 us for area averaging)."""
    import cv2

    small = cv2.resize(frame, (OBS_WIDTH, OBS_HEIGHT), interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(small.transpose(2, 0, 1))
