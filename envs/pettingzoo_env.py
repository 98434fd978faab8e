"""PettingZoo `ParallelEnv`s as the trainer's multi-agent envs (see `envs/multi_agent.py` for that API).

`appo.envs.make_env` wraps any `package.module:function` whose function returns a ParallelEnv in `PettingZooEnv`,
so `--env=mpe2.simple_spread_v3:parallel_env --env_kwargs='{"max_cycles": 25}'` trains unchanged. What the
adapter does, and why:

- Seats: one per `possible_agents` entry, in that order, for the whole run: the trainer sizes its buffers
  once, and agent j of an env always writes row j. All seats must share one observation space and one action
  space (one policy network acts for all of them); otherwise construction fails with a one-line `EnvError`.
- Agents that leave mid-episode (PettingZoo drops a terminated or truncated agent from `env.agents` and from
  the dicts it returns) keep their seat until the episode ends: reward 0, zero observations, and their
  actions are not passed to the env. Zeros rather than the last observation, as SuperSuit's `black_death`
  wrapper does: "gone" is then one fixed input the value head learns to predict 0 for (a gone agent earns
  nothing more), instead of a copy of a live-looking state whose value is not 0 while the agent plays. Seats
  whose agent has not joined yet (an env may start with fewer agents than `possible_agents`) look the same.
- The episode ends for every seat when `env.agents` is empty: terminated if every agent that ended was
  terminated, else truncated (a time limit, so the trainer may bootstrap the value).
- `info["agents"]` holds the per-agent infos of the step, keyed by agent name; `info["active"]` says which
  seats still play (after the step).
- An env of one agent (MPE's simple_v3) is a single-agent env: one observation, one reward, one action, as the
  trainer steps any env whose `num_agents` is 1. No `episode_extra_stats`: PettingZoo defines no episode metrics, and
  each seat's return is reported by the trainer already.

This module never imports pettingzoo: the wrapped env is duck-typed.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from appo.envs.observations import model_observations, model_space
from appo.envs.registry import EnvError
from appo.spaces import SpaceError


def is_parallel_env(env: Any) -> bool:
    """Whether `env` looks like a PettingZoo ParallelEnv: agent names plus per-agent space methods, and no AEC
    `last()` (an AEC env has the same attributes but is stepped one agent at a time)."""
    return (not isinstance(env, gym.Env) and hasattr(env, "possible_agents")
            and callable(getattr(env, "observation_space", None)) and callable(getattr(env, "action_space", None))
            and callable(getattr(env, "step", None)) and not callable(getattr(env, "last", None)))


def is_aec_env(env: Any) -> bool:
    """Whether `env` looks like a PettingZoo AECEnv (turn-based API: envs/pettingzoo_turns.py adapts it)."""
    return (not isinstance(env, gym.Env) and hasattr(env, "possible_agents")
            and callable(getattr(env, "observation_space", None)) and callable(getattr(env, "last", None)))


def _describe(space: gym.Space) -> str:
    """A short one-line description of a space (a Box's repr may print whole bound arrays over many lines)."""
    if isinstance(space, gym.spaces.Box):
        return f"Box{space.shape} {space.dtype}"
    text = " ".join(repr(space).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _differing(agents: list, spaces: list[gym.Space], kind: str) -> str | None:
    """None when every agent has the first agent's space, else a clause naming the agents whose space differs."""
    odd = [(agent, space) for agent, space in zip(agents, spaces) if space != spaces[0]]
    if not odd:
        return None
    names = ", ".join(str(agent) for agent, _ in odd)
    return f"{kind} space of {names} ({_describe(odd[0][1])}) differs from {agents[0]}'s ({_describe(spaces[0])})"


def differing_spaces(agents: list, observation_spaces: list[gym.Space], action_spaces: list[gym.Space]) -> str | None:
    """None when every agent has the first agent's spaces, else a one-line problem naming the agents that differ."""
    problems = [problem for problem in (_differing(agents, observation_spaces, "observation"),
                                        _differing(agents, action_spaces, "action")) if problem]
    if not problems:
        return None
    return (f"every agent of a PettingZoo env must have the same spaces (one policy acts for all): "
            f"{'; '.join(problems)}; pad them to one space (e.g. SuperSuit's pad_observations_v0 and "
            f"pad_action_space_v0) in a make function")


def seats(env: Any) -> tuple[list, gym.Space, gym.Space]:
    """A PettingZoo env's seats (its possible agents, in order) and the observation and action space they all share
    (the observation space as the env gives it: `model_space` turns it into the models'); EnvError when it has no
    agents, their spaces differ or the models take no form of the observation."""
    agents = list(env.possible_agents)
    if not agents:
        raise EnvError("the PettingZoo env has no possible_agents")
    observation_spaces = [env.observation_space(agent) for agent in agents]
    action_spaces = [env.action_space(agent) for agent in agents]
    problem = differing_spaces(agents, observation_spaces, action_spaces)
    if problem:
        raise EnvError(problem)
    try:
        model_space(observation_spaces[0])
    except SpaceError as exc:
        raise EnvError(str(exc)) from exc
    return agents, observation_spaces[0], action_spaces[0]


def zeros_of(space: gym.Space) -> np.ndarray | dict[str, np.ndarray]:
    """An all-zeros observation of `space`: what a seat without an agent in play sees."""
    if isinstance(space, gym.spaces.Dict):
        return {key: zeros_of(sub) for key, sub in space.spaces.items()}
    return np.zeros(space.shape, dtype=space.dtype)


class PettingZooEnv(gym.Env):
    """A PettingZoo ParallelEnv seen as the trainer's multi-agent env: fixed seats, stacked arrays, one end."""

    def __init__(self, env: Any):
        self.env = env
        self.possible_agents, self.given_space, self.action_space = seats(env)
        self.observation_space = model_space(self.given_space)
        self._seen = model_observations(self.given_space)
        self.num_agents = len(self.possible_agents)
        self.metadata = dict(getattr(env, "metadata", None) or {"render_modes": []})
        self.render_mode = getattr(env, "render_mode", None)
        self._zero_obs = zeros_of(self.observation_space)
        self._seat = {agent: i for i, agent in enumerate(self.possible_agents)}
        self._ended_by: dict[str, bool] = {}  # agent -> terminated (True) or truncated (False), this episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        observations, infos = self.env.reset(seed=seed, options=options)
        self._ended_by = {}
        return self._stack(observations, set(self.env.agents) | set(observations)), {
            "agents": dict(infos or {}), "active": self._active()}

    def step(self, actions: Any) -> tuple[Any, np.ndarray | float, bool, bool, dict]:
        """One action per seat (a list, or an array with one row per seat; one action alone for one seat); those of
        gone seats are dropped."""
        if self.num_agents == 1:
            actions = [actions]
        if len(actions) != self.num_agents:
            raise ValueError(f"expected one action per agent ({self.num_agents}: {self.possible_agents}), "
                             f"got {len(actions)}")
        playing = list(self.env.agents)
        observations, rewards, terminations, truncations, infos = self.env.step(
            {agent: actions[self._seat[agent]] for agent in playing})
        seat_rewards = np.zeros(self.num_agents, dtype=np.float32)
        for agent in playing:
            seat_rewards[self._seat[agent]] = rewards.get(agent, 0.0)
        for agent in playing:
            if terminations.get(agent, False) or truncations.get(agent, False):
                self._ended_by[agent] = bool(terminations.get(agent, False))
        # An agent's observation counts while it played this step (its last one, when it just ended) or joined.
        obs = self._stack(observations, set(playing) | set(self.env.agents))
        info = {"agents": dict(infos or {}), "active": self._active()}
        reward = float(seat_rewards[0]) if self.num_agents == 1 else seat_rewards
        if self.env.agents:
            return obs, reward, False, False, info
        terminated = bool(self._ended_by) and all(self._ended_by.values())
        return obs, reward, terminated, not terminated, info

    def _active(self) -> np.ndarray:
        active = np.zeros(self.num_agents, dtype=bool)
        active[[self._seat[agent] for agent in self.env.agents]] = True
        return active

    def _stack(self, observations: dict, present: set) -> Any:
        """Seat-ordered observations, zeros for seats without one; one array per key for Dict spaces."""
        rows = [self._seen(observations[agent]) if agent in present and agent in observations else self._zero_obs
                for agent in self.possible_agents]
        stack = np.stack if self.num_agents > 1 else lambda one: one[0]  # one seat: its observation alone
        if isinstance(self.observation_space, gym.spaces.Dict):
            return {key: stack([np.asarray(row[key], dtype=sub.dtype) for row in rows])
                    for key, sub in self.observation_space.spaces.items()}
        return stack([np.asarray(row, dtype=self.observation_space.dtype) for row in rows])

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
