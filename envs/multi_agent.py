"""A tiny cooperative multi-agent env: rendezvous on a ring.

Rules:
- `num_agents` agents (default 2) live on a ring of `ring_size` cells (default 8). On reset they start on
  distinct random cells. Each step every agent picks 0 = move left, 1 = stay, 2 = move right (the ring wraps).
- After the move, every agent gets reward 1.0 if all agents stand on the same cell, else 0.0 (a shared, team
  reward: nobody can earn anything alone). Per-step rewards are in [0, 1].
- Episodes never terminate; they are truncated after `max_steps` steps (default 50), for all agents at once.

Why it needs coordination: agents that stay together score every step, but they must first meet. If both
walk towards each other from an odd distance they cross and keep missing; if both "wait for the other" they
never meet. A shared policy must use the agent id in its observation to break the symmetry (e.g. one leads,
the other waits, or both approach and one stops at distance 1), and then both must keep still.

Observation of agent i (float32 vector of length num_agents + 2 * ring_size, values in [0, 1]):
  [one-hot agent id (num_agents) | one-hot own cell (ring_size) | partner presence by relative offset
   (ring_size): entry k is 1 when another agent stands k cells to the right of agent i, k = 0..ring_size-1].

Scores per agent per episode with the defaults (2 agents, ring_size 8, max_steps 50), mean over 2000 episodes:
- uniformly random actions: 6.3 (measured, std 3.4; the agents share a cell ~1/8 of the time);
- optimal play: 51 - ceil(d / 2) per episode, d = start ring distance (1..4); mean 49.6 (measured 49.58);
- leader/follower heuristic (agent 0 walks the short way to agent 1, agent 1 stays): 48.7 (measured 48.73).
A small PPO (shared 2x64 MLP, 32 envs) reaches a mean of 45 within ~3 s of 2-core CPU training.

The game is deterministic given the reset seed and the actions. A step takes about 4.5 microseconds
(Python ints plus one small numpy copy). The trainer registers it as "coop_multi_agent":

    --env=coop_multi_agent --env_kwargs='{"ring_size": 8, "max_steps": 50}'
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LEFT, STAY, RIGHT = 0, 1, 2


class RendezvousEnv(gym.Env):
    """Agents on a ring, all rewarded 1.0 per step while they all stand on the same cell."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, num_agents: int = 2, ring_size: int = 8, max_steps: int = 50,
                 render_mode: str | None = None):
        if num_agents < 2:
            raise ValueError(f"num_agents={num_agents}: a rendezvous needs at least 2 agents")
        if ring_size < num_agents:
            raise ValueError(f"ring_size={ring_size}: must be >= num_agents={num_agents} (agents start apart)")
        if max_steps < 1:
            raise ValueError(f"max_steps={max_steps}: must be >= 1")
        self.num_agents, self.ring_size, self.max_steps = int(num_agents), int(ring_size), int(max_steps)
        self.render_mode = render_mode
        obs_dim = self.num_agents + 2 * self.ring_size
        self.observation_space = gym.spaces.Box(0.0, 1.0, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        # Agent-id block of every observation; the rest is filled per step. Positions are plain ints: with a
        # handful of agents, Python lists are several times faster than numpy here.
        self._obs_template = np.zeros((self.num_agents, obs_dim), dtype=np.float32)
        self._obs_template[:, : self.num_agents] = np.eye(self.num_agents, dtype=np.float32)
        self._pos: list[int] = list(range(self.num_agents))
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)  # seeds self.np_random when seed is given
        self._pos = self.np_random.choice(self.ring_size, size=self.num_agents, replace=False).tolist()
        self._t = 0
        return self._obs(), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, bool, dict]:
        acts = actions.tolist() if isinstance(actions, np.ndarray) else list(actions)
        if len(acts) != self.num_agents:
            raise ValueError(f"actions {acts}: expected one action per agent ({self.num_agents})")
        size = self.ring_size
        for i, a in enumerate(acts):
            if a not in (LEFT, STAY, RIGHT):
                raise ValueError(f"actions {acts}: each must be 0 (left), 1 (stay) or 2 (right)")
            self._pos[i] = (self._pos[i] + int(a) - 1) % size  # action 0/1/2 moves by -1/0/+1 around the ring
        self._t += 1
        together = self._pos.count(self._pos[0]) == self.num_agents
        rewards = np.full(self.num_agents, 1.0 if together else 0.0, dtype=np.float32)
        truncated = self._t >= self.max_steps
        return self._obs(), rewards, False, truncated, {"together": together}

    def _obs(self) -> np.ndarray:
        n, size, pos = self.num_agents, self.ring_size, self._pos
        obs = self._obs_template.copy()
        for i, p in enumerate(pos):
            obs[i, n + p] = 1.0  # own cell
            for j, q in enumerate(pos):
                if j != i:
                    obs[i, n + size + (q - p) % size] = 1.0  # another agent (q - p) mod size cells to the right
        return obs

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        cells = ["."] * self.ring_size
        for i, p in enumerate(self._pos):
            cells[p] = "*" if cells[p] != "." else str(i)
        return "".join(cells)


# Generic alias: the built-in cooperative multi-agent example.
CooperativeEnv = RendezvousEnv


def make_multi_agent_env(**kwargs: Any) -> gym.Env:
    """A new `RendezvousEnv(**kwargs)`; the trainer registers this under "coop_multi_agent"."""
    return RendezvousEnv(**kwargs)
