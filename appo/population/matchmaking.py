"""Who acts for each agent of an episode: policies, and with self-play the frozen snapshots of a policy (acting
ids: appo/config/topology.py).

At every episode start `Matchmaker.draw` maps the agents of each env that starts one:
1. a learning policy per agent: `--policy_mapping=module:function` (a function of yours), else a uniform draw
   per agent, or per env with `--pbt_mix_policies_in_one_env=False`;
2. with self-play, one agent of the env (a random seat) keeps that policy p; with probability
   `1 - --self_play_latest_fraction`, and when p has snapshots, every other agent plays one snapshot of p drawn
   uniformly from its pool, so only that seat's side of the game is trained (learners mask the steps of other
   ids out). Otherwise the others keep their drawn policies: with one policy, the latest self.

This module is torch-free: actor workers use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from appo.config.checks import MappingError, load_mapping
from appo.config.topology import learning_policy, snapshot_ids

if TYPE_CHECKING:
    from appo.config.flags import Config


def acting_name(cfg: Config, acting_id: int, version: int) -> str:
    """How ratings and logs name who played: p<policy>, or p<policy>@v<version> for a snapshot."""
    if acting_id < cfg.num_policies:
        return f"p{acting_id}"
    return f"p{learning_policy(cfg, acting_id)}@v{version}"


class Matchmaker:
    """Draws the acting ids of the agents of envs that start an episode (see the module docstring).

    `policy_version` is the shared `SharedControl.policy_version`: a snapshot is drawn only once it exists."""

    def __init__(self, cfg: Config, num_agents: int, policy_version: np.ndarray,
                 rng: np.random.Generator):
        self.cfg, self.num_agents, self.rng = cfg, num_agents, rng
        self.policy_version = policy_version
        self.mapping = load_mapping(cfg.policy_mapping) if cfg.policy_mapping else None
        self.self_play = cfg.self_play_opponents > 0 and num_agents > 1

    def draw(self, num_envs: int) -> np.ndarray:
        """Acting ids [num_envs * num_agents] (env-major) for envs that start an episode."""
        ids = np.concatenate([self._policies() for _ in range(num_envs)]) if self.mapping else self._uniform(num_envs)
        if self.self_play:
            for env in range(num_envs):
                self._pick_opponents(ids[env * self.num_agents:(env + 1) * self.num_agents])
        return ids

    def _uniform(self, num_envs: int) -> np.ndarray:
        n, a, policies = num_envs * self.num_agents, self.num_agents, self.cfg.num_policies
        if self.cfg.pbt_mix_policies_in_one_env or a == 1:
            return self.rng.integers(0, policies, size=n, dtype=np.int16)
        return np.repeat(self.rng.integers(0, policies, size=num_envs, dtype=np.int16), a)

    def _policies(self) -> np.ndarray:
        """One env's policies from the user's mapping function, checked."""
        drawn = self.mapping(self.num_agents, self.cfg.num_policies, self.rng)
        ids = np.asarray(drawn)
        if (ids.shape != (self.num_agents,) or ids.dtype.kind not in "iu"
                or not ((ids >= 0) & (ids < self.cfg.num_policies)).all()):
            raise MappingError(f"--policy_mapping={self.cfg.policy_mapping} returned {drawn!r}: expected "
                               f"{self.num_agents} policy ids (one per agent) in 0..{self.cfg.num_policies - 1}")
        return ids.astype(np.int16)

    def _pick_opponents(self, env_ids: np.ndarray) -> None:
        """Self-play for one env (in place): a random seat learns; the others may play one of its snapshots."""
        if self.rng.random() < self.cfg.self_play_latest_fraction:
            return
        seat = int(self.rng.integers(self.num_agents))
        pool = [i for i in snapshot_ids(self.cfg, int(env_ids[seat])) if self.policy_version[i] >= 0]
        if pool:
            opponent = pool[int(self.rng.integers(len(pool)))]
            env_ids[:seat] = opponent
            env_ids[seat + 1:] = opponent
