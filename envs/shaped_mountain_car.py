"""MountainCar-v0 with a fuel cost and one reward-shaping coefficient, for population-based training (PBT).

MountainCar's own reward is -1 per step until the goal (200-step limit). Here each push (action 0 or 2) also
costs `push_cost`, as fuel does in MountainCarContinuous: until a policy has found the goal, pushing only
costs, so PPO learns to coast and stops exploring (a policy whose actions follow the velocity from its random
initialisation would otherwise stumble on the goal within seconds). A bonus for speed makes swinging pay,
once it outweighs the fuel; how much bonus is enough (or too much: swinging for the bonus forever instead of
ending the episode at the goal) is what PBT is meant to find, so the coefficient is read and replaced through
a small interface:

- `get_reward_shaping() -> dict[str, float]`: the current coefficients, `{"velocity_bonus": value}`.
- `set_reward_shaping(scheme)`: replaces them (an unknown key raises ValueError); takes effect from the next step.
- `get_reward_shaping_bounds()`: the range PBT keeps the bonus in, `{"velocity_bonus": (0.1, 10.0)}`. Below 0.1
  the bonus is lost next to the -1 per step and the fuel; far above 10 the swinging itself pays more than
  reaching the goal, and the car swings for ever (PBT runs that took the bonus to 100 and more stalled at a
  mean progress of 0.7 to 0.9).
- Each step: `reward = env_reward - push_cost * pushed + velocity_bonus * abs(velocity) / max_speed`, a bonus
  in [0, velocity_bonus].
- At episode end (terminated or truncated): `info["true_objective"]` is 1.0 if the car reached the goal, else
  0.0. PBT ranks policies by it, never by the shaped reward, which the coefficient itself changes. The
  episode's metrics (averaged per policy, in tensorboard under episode_extra/) are in
  `info["episode_extra_stats"]`: `true_objective` again, `unshaped_return` (the return without the bonus:
  env reward and fuel) and `progress`, how far toward the goal the car got: (highest position - left edge)
  / (goal - left edge), 1.0 at the goal. Until some policy reaches the goal, `true_objective` is 0 for
  everyone and ranks nothing; `progress` does, and a mean progress of 0.99 over 100 episodes means at least
  96 of them reached the goal (`--pbt_target_objective=progress`; scripts/pbt_experiment.py at e9777ba).

    --env=mountain_car_shaped --env_kwargs='{"velocity_bonus": 0.5}'
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

# Measured on 2 cores with --normalize_input=True (single policy, 60 s each): with a push cost of 0.1, even bonus 0
# reached the goal in 12 s; at 0.5, bonus 0, 0.3 and 1 learned to coast and never got there, and bonus 2 reached it
# in 12.5 s. So the default bonus is too small to learn from.
DEFAULT_VELOCITY_BONUS = 0.3
DEFAULT_PUSH_COST = 0.5
VELOCITY_BONUS_BOUNDS = (0.1, 10.0)
COAST = 1  # MountainCar-v0's action that does not push


class ShapedMountainCar(gym.Wrapper):
    def __init__(self, env: gym.Env, velocity_bonus: float = DEFAULT_VELOCITY_BONUS,
                 push_cost: float = DEFAULT_PUSH_COST):
        super().__init__(env)
        self.push_cost = float(push_cost)
        self.max_speed = float(env.unwrapped.max_speed)
        self.velocity_bonus = float(velocity_bonus)
        self.unshaped_return = 0.0
        self.highest = -float("inf")

    def get_reward_shaping(self) -> dict[str, float]:
        return {"velocity_bonus": self.velocity_bonus}

    def get_reward_shaping_bounds(self) -> dict[str, tuple[float, float]]:
        return {"velocity_bonus": VELOCITY_BONUS_BOUNDS}

    def set_reward_shaping(self, scheme: dict[str, float]) -> None:
        for key in scheme:
            if key != "velocity_bonus":
                raise ValueError(f"unknown reward-shaping key {key!r}; known: ['velocity_bonus']")
        if "velocity_bonus" in scheme:
            self.velocity_bonus = float(scheme["velocity_bonus"])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.unshaped_return = 0.0
        self.highest = -float("inf")
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward) - self.push_cost * (int(action) != COAST)
        self.unshaped_return += reward
        self.highest = max(self.highest, float(obs[0]))
        shaped = reward + self.velocity_bonus * abs(float(obs[1])) / self.max_speed
        if terminated or truncated:
            car = self.env.unwrapped
            progress = 1.0 if terminated else (self.highest - car.min_position) / (car.goal_position - car.min_position)
            goal = 1.0 if terminated else 0.0
            info = {**info, "true_objective": goal, "episode_extra_stats": {
                "true_objective": goal, "unshaped_return": self.unshaped_return, "progress": min(1.0, progress)}}
        return obs, shaped, terminated, truncated, info


def make_shaped_mountain_car(velocity_bonus: float = DEFAULT_VELOCITY_BONUS, push_cost: float = DEFAULT_PUSH_COST,
                             render_mode: str | None = None) -> ShapedMountainCar:
    env = gym.make("MountainCar-v0", disable_env_checker=True, render_mode=render_mode)
    return ShapedMountainCar(env, velocity_bonus, push_cost)

