"""Action masks as the trainer sees them: always the `action_mask` key of a Dict observation (appo.spaces.MASK_KEY).

`make_env` wraps every env whose actions are masked in `ActionMasks`, which
- moves a mask that the env gives in `info` (`--action_mask=info` or `info:KEY`) into the observation, so that
  inference, the trajectory buffers (the mask each action was taken under), the learner, evaluation and exported
  models all read it from one place;
- checks each mask's size against the action space, and stops the run (`NoLegalAction`) when a mask allows no
  action at all: no policy can act on it, and sampling one anyway would hand the env an illegal action;
- counts the actions it is given that the mask did not allow (`take_illegal`): masked sampling makes none, and the
  count, reported as a fault, shows that.

A turn-based env (`TurnBasedEnv`, PettingZoo's AEC games) marks the seats that wait for their turn with masks that
allow nothing: those seats do not act and their steps train no policy (appo/learning/batching.py). For such an env
the check applies to the seat whose turn it is, which the adapter makes itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np

from appo.envs.registry import EnvError
from appo.spaces import MASK_KEY, SINGLE_KEY, SpaceError, mask_size


class NoLegalAction(EnvError):
    """An action mask allowed no action where an agent had to act: the run stops, naming the env and the step."""


def mask_source(flag: str, obs_space: gym.Space) -> tuple[str, str] | None:
    """Where an env's masks come from under `--action_mask=flag`: ("obs", MASK_KEY), ("info", its key), or None (no
    masking)."""
    if flag == "info":
        return "info", MASK_KEY
    if flag.startswith("info:"):
        return "info", flag[len("info:"):]
    is_dict = isinstance(obs_space, gym.spaces.Dict)
    return ("obs", MASK_KEY) if flag == "auto" and is_dict and MASK_KEY in obs_space.spaces else None


def allowed(mask: np.ndarray, sizes: list[int], action: Any, starts: Any = 0) -> bool:
    """Whether a flat mask (`sizes`: choices per action part) allows the env's `action` (an int, or one int per
    part), whose parts number their choices from `starts` (a space's `start`)."""
    parts = np.atleast_1d(np.asarray(action) - starts).astype(np.int64).ravel()
    offsets = np.cumsum([0, *sizes[:-1]])
    return bool(np.all(mask[offsets + parts] > 0))


def legal_random_action(action_space: gym.Space, mask: np.ndarray, rng: np.random.Generator) -> Any:
    """A uniformly random action among those `mask` allows (each part of a MultiDiscrete drawn on its own). A mask
    that allows nothing (a seat waiting for its turn, whose action the env does not play) gives the first action."""
    if isinstance(action_space, gym.spaces.Discrete):
        choices = np.flatnonzero(mask)
        return int(action_space.start + (rng.choice(choices) if len(choices) else 0))
    parts, offset = [], 0
    for n in action_space.nvec.ravel():
        choices = np.flatnonzero(mask[offset:offset + n])
        parts.append(rng.choice(choices) if len(choices) else 0)
        offset += n
    return (np.reshape(parts, action_space.shape) + action_space.start).astype(action_space.dtype)


def random_actions(action_space: gym.Space, obs: Any, num_agents: int, rng: np.random.Generator) -> tuple[Any, int]:
    """A uniformly random action for each of `num_agents` agents (one alone, several as a list), and how many act.
    Under an action mask (a Dict observation's `action_mask`, one row per agent) each action is one its row allows,
    as masked sampling takes, and an agent whose row allows nothing waits for its turn and is not counted: a
    turn-based game counts moves."""
    discrete = isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))  # what masks can mask
    masks = obs.get(MASK_KEY) if discrete and isinstance(obs, dict) else None
    if masks is None:
        actions, acting = [action_space.sample() for _ in range(num_agents)], num_agents
    else:
        rows = np.asarray(masks).reshape(num_agents, -1)
        actions = [legal_random_action(action_space, row, rng) for row in rows]
        acting = int(rows.any(axis=1).sum())
    return (actions[0] if num_agents == 1 else actions), acting


class ActionMasks(gym.Wrapper):
    """Masks in the observation, checked; illegal actions counted. See the module docstring."""

    def __init__(self, env: gym.Env, source: tuple[str, str], env_id: str):
        super().__init__(env)
        self.from_info = source[1] if source[0] == "info" else None  # the info key, when the mask is in info
        self.env_id = env_id
        self.num_agents = int(getattr(env, "num_agents", 1))
        self.turn_based = bool(getattr(env, "turn_based", False))
        try:
            size = mask_size(env.action_space)
        except SpaceError as exc:
            raise EnvError(f"--env={env_id}: {exc}") from exc
        self.sizes = [int(n) for n in np.ravel(getattr(env.action_space, "nvec", env.action_space.n))]
        self.starts = env.action_space.start
        mask_space = gym.spaces.Box(0, 1, (size,), np.int8)
        if self.from_info is not None:
            inner = env.observation_space
            keys = dict(inner.spaces) if isinstance(inner, gym.spaces.Dict) else {SINGLE_KEY: inner}
            self.observation_space = gym.spaces.Dict({**keys, MASK_KEY: mask_space})
        elif self.observation_space[MASK_KEY].shape != (size,):
            raise EnvError(f"--env={env_id}: its {MASK_KEY!r} observation has shape "
                           f"{self.observation_space[MASK_KEY].shape}; {env.action_space} needs ({size},)")
        self.masks: np.ndarray | None = None  # [agents, size]: what the last observation allows
        self.step_in_episode = 0
        self.illegal = 0  # actions given that the mask did not allow, since the last take_illegal

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self.step_in_episode = 0
        return self._with_masks(obs, info), info

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict]:
        self._count_illegal(action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.step_in_episode += 1
        return self._with_masks(obs, info), reward, terminated, truncated, info

    def take_illegal(self) -> int:
        """Illegal actions given since the last call."""
        illegal, self.illegal = self.illegal, 0
        return illegal

    def _count_illegal(self, action: Any) -> None:
        if self.masks is None:
            return
        actions = action if self.num_agents > 1 else [action]
        for mask, agent_action in zip(self.masks, actions):
            # a seat that acts (turn-based: its turn)
            if mask.any() and not allowed(mask, self.sizes, agent_action, self.starts):
                self.illegal += 1

    def _with_masks(self, obs: Any, info: dict) -> Any:
        if self.from_info is None:
            mask = obs[MASK_KEY]
        else:
            if self.from_info not in info:
                raise EnvError(f"--env={self.env_id}: --action_mask reads info[{self.from_info!r}], which step "
                               f"{self.step_in_episode} of an episode lacks (its keys: {sorted(info)})")
            mask = np.asarray(info[self.from_info], dtype=np.int8)
            obs = {**(obs if isinstance(obs, dict) else {SINGLE_KEY: obs}), MASK_KEY: mask}
        masks = np.asarray(mask).reshape(self.num_agents, -1)
        if masks.shape[1] != sum(self.sizes):
            raise EnvError(f"--env={self.env_id}: an action mask of {masks.shape[1]} entries at step "
                           f"{self.step_in_episode} of an episode; {self.env.action_space} needs {sum(self.sizes)}")
        if not self.turn_based:  # a PettingZoo ParallelEnv's seat whose agent has left (info["active"]) acts no more
            active = info.get("active")
            playing = range(len(masks)) if active is None else np.flatnonzero(active).tolist()
            self.check_allows_some(masks, playing, self.env_id, self.step_in_episode, self.sizes)
        self.masks = masks
        return obs

    @staticmethod
    def check_allows_some(masks: np.ndarray, rows: Iterable[int], env_id: str, step: int, sizes: list[int]) -> None:
        """Raise NoLegalAction when one of the `rows` of `masks` leaves an action part without an allowed choice."""
        offsets = np.cumsum([0, *sizes])
        for row in rows:
            mask = masks[row]
            if any(not mask[start:end].any() for start, end in zip(offsets[:-1], offsets[1:])):
                agent = f" agent {row}'s" if len(masks) > 1 else ""
                raise NoLegalAction(f"--env={env_id}:{agent} action mask allows no action at step {step} of an "
                                    f"episode; an env must allow at least one action wherever an agent acts")
