"""Catch: a small image task that a CNN policy learns in well under a minute on a 2-core CPU.

The classic game (bsuite's `catch`, after Mnih et al. 2014), with several balls per episode:
- The grid has `rows` = 10 rows and `columns` = 5 columns. A paddle one cell wide moves on the bottom row;
  a ball starts in the top row, in a uniformly random column, and falls one row per step.
- Actions Discrete(3): 0 = left, 1 = stay, 2 = right; the paddle stops at the walls. Each step the paddle
  moves first, then the ball falls.
- When the ball reaches the bottom row the reward is +1 if the paddle is under it (a catch), else -1, and
  the next ball appears in the top row on that same step. Every other step's reward is 0. A ball falls for
  `rows` - 1 steps, so the paddle can always reach it in time from anywhere on a row of up to `rows` cells.
- An episode is `balls` = 10 balls (terminated after the last one), so returns lie in [-10, 10]. The paddle
  starts in the middle column and stays where it is between balls. The last step's info has
  `episode_extra_stats` {catch_rate}.

Observation: uint8 image [rows, columns, 1], 255 on the ball's and the paddle's cells, 0 elsewhere. A 10 x 5
grid gets the trainer's `small_cnn` (appo/spaces.py auto_encoder), which takes any size, and image defaults
(appo/config/auto.py IMAGE_LEARNING). Deterministic given the reset seed and the actions.

Measured on a 2-core CPU, `python -m appo.train --env=catch --train_for_seconds=120` (two runs): a mean return of
9.44 and 9.66 at the status lines of 22 s and 15 s (106k and 133k env steps), 9.96 at the end. Uniformly random
actions catch a fifth of the balls (mean return -5.9 over 300 episodes). Registered as "catch":

    python -m appo.train --env=catch --env_kwargs='{"columns": 10, "balls": 20}'
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LEFT, STAY, RIGHT = 0, 1, 2
ON = 255  # pixel value of the ball and the paddle


class CatchEnv(gym.Env):
    """A falling ball and a paddle on the bottom row; see the module docstring for the rules."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, rows: int = 10, columns: int = 5, balls: int = 10, render_mode: str | None = None):
        if rows < 2 or columns < 1 or balls < 1:
            raise ValueError(f"rows={rows}, columns={columns}, balls={balls}: need rows >= 2, columns >= 1, balls >= 1")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r}: only 'rgb_array' (or None)")
        self.rows, self.columns, self.balls = rows, columns, balls
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0, ON, (rows, columns, 1), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.paddle = columns // 2
        self.ball_row = self.ball_column = 0
        self.balls_left = balls
        self.catches = 0

    def _drop_ball(self) -> None:
        self.ball_row, self.ball_column = 0, int(self.np_random.integers(self.columns))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)  # seeds self.np_random when seed is given
        self.paddle = self.columns // 2
        self.balls_left, self.catches = self.balls, 0
        self._drop_ball()
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if action not in (LEFT, STAY, RIGHT):
            raise ValueError(f"action {action!r}: expected 0 (left), 1 (stay) or 2 (right)")
        self.paddle = min(self.columns - 1, max(0, self.paddle + int(action) - 1))
        self.ball_row += 1
        reward, terminated, info = 0.0, False, {}
        if self.ball_row == self.rows - 1:
            caught = self.ball_column == self.paddle
            self.catches += caught
            reward = 1.0 if caught else -1.0
            self.balls_left -= 1
            terminated = self.balls_left == 0
            if terminated:
                info["episode_extra_stats"] = {"catch_rate": self.catches / self.balls}
            else:
                self._drop_ball()
        return self._obs(), reward, terminated, False, info

    def _obs(self) -> np.ndarray:
        """The grid with the ball and the paddle lit (they share a cell on a catch)."""
        grid = np.zeros((self.rows, self.columns, 1), np.uint8)
        grid[self.ball_row, self.ball_column, 0] = ON
        grid[self.rows - 1, self.paddle, 0] = ON
        return grid

    def render(self) -> np.ndarray:
        """The grid as an RGB image, one pixel per cell."""
        return np.repeat(self._obs(), 3, axis=2)

