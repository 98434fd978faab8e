"""PettingZoo AEC (turn-based) envs as the trainer's multi-agent envs: PettingZoo's classic games and the like.

`appo.envs.make_env` wraps any `package.module:function` whose function returns an AECEnv in `TurnBasedEnv`, so
`--env=pettingzoo.classic.connect_four_v3:env` trains as it is. In an AEC env one agent acts at a time (its
`agent_selection`); the trainer steps every seat of an env together, so the adapter makes a turn one step:
- Seats: one per `possible_agents` entry, as for ParallelEnvs (envs/pettingzoo_env.py): every seat gets an
  observation every step (`observe(agent)`: the board as that agent sees it), and one policy network acts for all.
- Whose turn it is travels in the action mask (the `action_mask` observation key, appo.spaces.MASK_KEY): the seat
  to move gets its legal moves (the env's own `action_mask`, or every action for an env without one), every other
  seat a mask that allows nothing. Such a seat does not act: its action is not passed on, and its step trains no
  policy (appo/learning/batching.py) while its value head still learns what the position is worth to it.
- A step plays the acting seat's action and gives every seat its `rewards` entry of that move, so a game's final
  rewards (+1 the winner, -1 the loser) reach every agent that played it, whoever made the last move.
- The game ends when every agent is terminated or truncated: terminated if all were terminated, else truncated.
  An agent that is out while others play on (a multi-player game) is stepped out with `None` as the AEC API asks,
  and its seat sees zeros from then on.
- A seat to move whose mask allows nothing stops the run (`NoLegalAction`), naming the env and the move.
- With `random_opening_moves` (training's `--random_opening_moves`), a game starts after a random number, 0 to that,
  of uniformly random legal moves: self-play alone keeps to its own lines of play, and a player from elsewhere leads
  it off them. An opening that ends the game is played again.
Actions must be Discrete or MultiDiscrete (a mask needs choices). This module never imports pettingzoo.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from appo.envs.action_masks import NoLegalAction, random_actions
from appo.envs.observations import model_observations, model_space
from appo.envs.pettingzoo_env import seats, zeros_of
from appo.envs.registry import EnvError
from appo.spaces import MASK_KEY, SINGLE_KEY, SpaceError, mask_size


class TurnBasedEnv(gym.Env):
    """A PettingZoo AECEnv seen as a multi-agent env whose seats take turns. See the module docstring."""

    turn_based = True  # appo.envs.action_masks.ActionMasks: a mask that allows nothing means "not this seat's turn"

    def __init__(self, env: Any, env_id: str):
        self.env, self.env_id = env, env_id
        self.possible_agents, self.given_space, self.action_space = seats(env)
        self.num_agents = len(self.possible_agents)
        try:
            size = mask_size(self.action_space)
        except SpaceError as exc:
            raise EnvError(f"a turn-based env's seats are told whose turn it is by an action mask: {exc}") from exc
        inner = model_space(self.given_space)
        self._seen = model_observations(self.given_space)
        keys = dict(inner.spaces) if isinstance(inner, gym.spaces.Dict) else {SINGLE_KEY: inner}
        self.env_gives_mask = MASK_KEY in keys
        self.observation_space = gym.spaces.Dict({**keys, MASK_KEY: gym.spaces.Box(0, 1, (size,), np.int8)})
        self.metadata = dict(getattr(env, "metadata", None) or {"render_modes": []})
        self.render_mode = getattr(env, "render_mode", None)
        self._zero_obs = zeros_of(self.observation_space)
        self._all_allowed = np.ones(size, dtype=np.int8)
        self.moves = 0  # moves played in this game
        self.random_opening_moves = 0  # at most this many random legal moves start each game

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.env.reset(seed=seed, options=options)
        self.moves = 0
        self._play_opening()
        return self._observe(), {"agents": dict(getattr(self.env, "infos", {}) or {})}

    def _play_opening(self) -> None:
        """Up to `random_opening_moves` uniformly random legal moves (how many drawn per game); an opening that ends
        the game starts it again."""
        for _ in range(int(self.np_random.integers(0, self.random_opening_moves + 1))):
            actions, _ = random_actions(self.action_space, self._observe(), self.num_agents, self.np_random)
            _, _, terminated, truncated, _ = self.step(actions)
            if terminated or truncated:
                self.env.reset()
                self.moves = 0
                return

    def step(self, actions: Any) -> tuple[Any, np.ndarray, bool, bool, dict]:
        """One move: the action of the seat whose turn it is; the other seats' actions are ignored."""
        if len(actions) != self.num_agents:
            raise ValueError(f"expected one action per agent ({self.num_agents}: {self.possible_agents}), "
                             f"got {len(actions)}")
        mover = self.env.agent_selection
        action = actions[self.possible_agents.index(mover)]
        self.env.step(int(action) if isinstance(self.action_space, gym.spaces.Discrete) else np.asarray(action))
        self.moves += 1
        rewards = np.array([self.env.rewards.get(agent, 0.0) for agent in self.possible_agents], dtype=np.float32)
        while self.env.agents and not self._game_over() and self._out(self.env.agent_selection):
            self.env.step(None)  # an agent that is out while others play on leaves when its turn comes
        info = {"agents": dict(getattr(self.env, "infos", {}) or {})}
        if not self._game_over():
            return self._observe(), rewards, False, False, info
        terminated = all(self.env.terminations.get(agent, False) for agent in self.env.agents)
        return self._observe(), rewards, terminated, not terminated, info

    def _out(self, agent: str) -> bool:
        return bool(self.env.terminations.get(agent, False) or self.env.truncations.get(agent, False))

    def _game_over(self) -> bool:
        return not self.env.agents or all(self._out(agent) for agent in self.env.agents)

    def _observe(self) -> dict[str, np.ndarray]:
        """Every seat's observation, the mover's mask its legal moves and every other seat's mask all zeros."""
        over = self._game_over()
        rows = []
        for agent in self.possible_agents:
            if agent not in self.env.agents:
                rows.append(self._zero_obs)
                continue
            seen = self._seen(self.env.observe(agent))
            row = dict(seen) if isinstance(seen, dict) else {SINGLE_KEY: seen}
            to_move = not over and agent == self.env.agent_selection
            mask = np.asarray(row.get(MASK_KEY, self._all_allowed), dtype=np.int8) if to_move else \
                np.zeros_like(self._all_allowed)
            if to_move and not mask.any():
                raise NoLegalAction(f"--env={self.env_id}: {agent}'s turn at move {self.moves} of a game, and its "
                                    f"action mask allows no action")
            rows.append({**row, MASK_KEY: mask})
        return {key: np.stack([np.asarray(row[key], dtype=sub.dtype) for row in rows])
                for key, sub in self.observation_space.spaces.items()}

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
