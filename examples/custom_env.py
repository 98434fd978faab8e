"""A custom env and a launcher for it (docs/guide_custom_env.md).

ReachTarget, a 1-D task: a point starts at a random place on the line [-1, 1] and must walk to a random target.
Actions: 0 = left, 1 = stay, 2 = right, 0.1 per step. Observation: [position, target - position] (float32).
Reward: -0.02 per step, +1 on reaching the target (within 0.075, which ends the episode), plus a reward-shaping
term `distance_bonus * (distance before the step - distance after it)`. Episodes are cut at 50 steps.
At an episode's end, `info["episode_extra_stats"]` holds `reached` (1.0 or 0.0), `final_distance` and
`unshaped_return` (the return without the shaping term), and `info["true_objective"]` is `reached`.
Random play reaches the target in about a quarter of the episodes; a trained policy walks straight to it.

Train it by its module path (any process can then make it: the trainer, enjoy, export, load_policy):

    python -m appo.train --env=examples.custom_env:make_reach_target --experiment=reach --train_for_env_steps=150000

or by the name this file registers, through this file as a launcher (`enjoy` and `export` as the first
argument run appo.enjoy or appo.export instead, with the name registered there too):

    python examples/custom_env.py --env=reach_target --experiment=reach_named --train_for_env_steps=150000
    python examples/custom_env.py enjoy --experiment=reach_named --deterministic
"""

from __future__ import annotations

import sys
from typing import Any

import gymnasium as gym
import numpy as np

from appo.envs import register_env

LEFT, STAY, RIGHT = 0, 1, 2


class ReachTarget(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, max_steps: int = 50, step_size: float = 0.1, reach: float = 0.075,
                 distance_bonus: float = 1.0, render_mode: str | None = None):
        self.max_steps, self.step_size, self.reach = int(max_steps), float(step_size), float(reach)
        self.distance_bonus = float(distance_bonus)
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.position = self.target = 0.0
        self.t, self.unshaped_return = 0, 0.0

    # ---------------------------------------------------------------- the gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)  # seeds self.np_random
        self.position = float(self.np_random.uniform(-1.0, 1.0))
        self.target = float(self.np_random.uniform(-1.0, 1.0))
        while abs(self.target - self.position) < 0.3:  # start a few steps away
            self.target = float(self.np_random.uniform(-1.0, 1.0))
        self.t, self.unshaped_return = 0, 0.0
        return self._obs(), {}

    def step(self, action):
        before = abs(self.target - self.position)
        self.position = float(np.clip(self.position + (int(action) - 1) * self.step_size, -1.0, 1.0))
        self.t += 1
        distance = abs(self.target - self.position)
        terminated = distance < self.reach
        truncated = not terminated and self.t >= self.max_steps
        reward = -0.02 + (1.0 if terminated else 0.0)
        self.unshaped_return += reward
        info: dict[str, Any] = {}
        if terminated or truncated:
            reached = 1.0 if terminated else 0.0
            info = {"true_objective": reached,  # what PBT ranks by, never the shaped reward
                    "episode_extra_stats": {"reached": reached, "final_distance": distance,
                                            "unshaped_return": self.unshaped_return}}
        return self._obs(), reward + self.distance_bonus * (before - distance), terminated, truncated, info

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.target - self.position], dtype=np.float32)

    def render(self) -> np.ndarray | None:
        """A 32x256 RGB frame: the line, the target (green) and the point (white)."""
        if self.render_mode != "rgb_array":
            return None
        frame = np.zeros((32, 256, 3), dtype=np.uint8)
        frame[15:17] = 80

        def column(x: float) -> int:
            return int(round((x + 1.0) / 2.0 * 251)) + 2

        frame[6:26, column(self.target) - 2:column(self.target) + 3] = (0, 200, 0)
        frame[10:22, column(self.position) - 2:column(self.position) + 3] = 255
        return frame

    # ---------------------------------------------------------------- reward shaping, for PBT
    def get_reward_shaping(self) -> dict[str, float]:
        return {"distance_bonus": self.distance_bonus}

    def set_reward_shaping(self, scheme: dict[str, float]) -> None:
        for key, value in scheme.items():
            if key != "distance_bonus":
                raise ValueError(f"unknown reward-shaping key {key!r}; known: ['distance_bonus']")
            self.distance_bonus = float(value)

    def get_reward_shaping_bounds(self) -> dict[str, tuple[float, float]]:
        return {"distance_bonus": (0.0, 5.0)}


def make_reach_target(**kwargs: Any) -> ReachTarget:
    """`--env=examples.custom_env:make_reach_target`; `--env_kwargs` and enjoy's render_mode come as kwargs."""
    return ReachTarget(**kwargs)


register_env("reach_target", make_reach_target)  # on import: a launcher's workers are forked and inherit it


def random_return(episodes: int = 200, seed: int = 0) -> float:
    """The mean return of uniformly random actions, the baseline a trained policy should beat."""
    env, rng, total = ReachTarget(), np.random.default_rng(seed), 0.0
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(3)))
            total += reward
            done = terminated or truncated
    return total / episodes


if __name__ == "__main__":
    command, argv = (sys.argv[1], sys.argv[2:]) if sys.argv[1:2] in (["enjoy"], ["export"]) else ("train", sys.argv[1:])
    if command == "enjoy":
        from appo.enjoy import main
    elif command == "export":
        from appo.export import main
    else:
        from appo.train import main
    sys.exit(main(argv))
