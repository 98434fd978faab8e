"""A tiny turn-based game with PettingZoo's AEC API (duck-typed, no pettingzoo import), for the adapter's tests:
`--env=tests.turn_envs:take_away`.

Take-away: a pile of `pile` stones; the players take 1 or 2 stones in turn (action 0 takes one, 1 takes two); who
takes the last stone wins (+1, the other -1). The observation is the pile's size over `pile`; with `masks` the
observation is a Dict with `action_mask` (taking two is not allowed when one stone is left). `no_moves_at` makes the
mover's mask allow nothing at that move (a broken env, which must stop the run). `continuous` gives a Box action
space, which a turn-based env cannot have.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class TakeAway:
    metadata = {"render_modes": []}

    def __init__(self, pile: int = 7, masks: bool = True, no_moves_at: int = -1, continuous: bool = False):
        self.pile, self.masks, self.no_moves_at = pile, masks, no_moves_at
        self.possible_agents = ["first", "second"]
        box = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self._obs_space = gym.spaces.Dict({"observation": box, "action_mask": gym.spaces.Box(0, 1, (2,), np.int8)}) \
            if masks else box
        self._action_space = gym.spaces.Box(-1, 1, (1,)) if continuous else gym.spaces.Discrete(2)
        self.moves_made = []  # (agent, action) of every move, for the tests

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        return self._action_space

    def reset(self, seed=None, options=None) -> None:
        self.left, self.moves = self.pile, 0
        self.agents = list(self.possible_agents)
        self.agent_selection = "first"
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}

    def observe(self, agent: str):
        size = np.array([self.left / self.pile], dtype=np.float32)
        if not self.masks:
            return size
        mask = np.array([1, 1 if self.left >= 2 else 0], dtype=np.int8)
        if agent != self.agent_selection or self.moves == self.no_moves_at:
            mask[:] = 0
        return {"observation": size, "action_mask": mask}

    def last(self):
        return self.observe(self.agent_selection), 0.0, False, False, {}

    def step(self, action) -> None:
        mover = self.agent_selection
        if self.terminations[mover]:
            self.agents.remove(mover)  # a dead step
            return
        self.moves_made.append((mover, int(action)))
        self.left -= int(action) + 1
        self.moves += 1
        other = "second" if mover == "first" else "first"
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if self.left <= 0:
            self.rewards[mover], self.rewards[other] = 1.0, -1.0
            self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = other

    def close(self) -> None:
        pass


def take_away(**kwargs) -> TakeAway:
    return TakeAway(**kwargs)
