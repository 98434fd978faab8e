"""Who plays each env-agent of one actor worker: the acting id (a policy or a self-play snapshot) drawn at each
episode start, and the reward shaping of the policy an env plays for.

Writes control.actors.agent_policy[worker] (the acting id per split and env-agent, read by inference and the
learners through traj.policy_ids) and, after a redraw, traj.policy_ids of the rest of the trajectory.
Reads control.runner.reward_shaping (PBT's coefficients). Torch-free.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from appo.config.topology import learning_policy, num_acting_ids
from appo.population.matchmaking import Matchmaker
from appo.workers.context import WorkerContext


class AgentPolicies:
    """The acting id of every env-agent of one worker's splits (`--agent_policy_mapping`), drawn by the matchmaker
    (appo/population/matchmaking.py), and the reward-shaping scheme each env gets from its policy."""

    def __init__(self, ctx: WorkerContext, worker: int, rng: np.random.Generator):
        cfg, layout, control = ctx.cfg, ctx.layout, ctx.control
        self.cfg, self.worker, self.num_splits, self.num_agents = cfg, worker, layout.num_splits, layout.num_agents
        self.num_acting = num_acting_ids(cfg)
        self.agent_policy = control.actors.agent_policy[worker]  # [split, env-agent]
        self.policy_ids = ctx.traj.policy_ids
        self.matchmaker = Matchmaker(cfg, layout.num_agents, control.learners.policy_version, rng)
        # Reward-shaping coefficients PBT sets per policy (control.runner.reward_shaping); none without PBT.
        self.shaping_keys = control.runner.shaping_keys if cfg.with_pbt else ()
        self.reward_shaping = control.runner.reward_shaping

    def start(self, s: int) -> np.ndarray:
        """Draw split s's players for its first episodes; returns them (one per env-agent).

        With --agent_policy_mapping=split, split s of worker w belongs to policy (w * splits + s) % policies for
        good: a step of it needs one forward pass. Otherwise the matchmaker's draw, renewed at every episode start."""
        n = self.agent_policy.shape[1]
        if self.cfg.agent_policy_mapping == "split":
            split_index = self.worker * self.num_splits + s
            self.agent_policy[s] = np.full(n, split_index % self.cfg.num_policies, dtype=np.int16)
        else:
            self.agent_policy[s] = self.matchmaker.draw(n // self.num_agents)
        return self.agent_policy[s]

    def acting_ids(self, s: int) -> list[int]:
        """The acting ids of some env-agent of split s (np.unique costs ~150 us with cold caches)."""
        if self.num_acting == 1:
            return [0]
        return sorted(set(self.agent_policy[s].tolist()))

    def learning_policies(self, s: int) -> list[int]:
        """The learning policies of split s's acting ids (a snapshot's is the policy it was taken from)."""
        return [learning_policy(self.cfg, p) for p in self.acting_ids(s)]

    def redraw(self, s: int, dones: np.ndarray, slots: np.ndarray, from_t: int) -> None:
        """The env-agents of split s that ended an episode (`dones`) draw their next players (with
        --agent_policy_mapping=episode and more than one acting id); the rest of their trajectory rows is theirs."""
        if self.num_acting == 1 or self.cfg.agent_policy_mapping != "episode":
            return
        policies = self.agent_policy[s]
        policies[dones] = self.matchmaker.draw(int(dones.sum()) // self.num_agents)  # all agents of an env end together
        self.policy_ids[slots[dones], from_t:] = policies[dones, None]

    def shape(self, s: int, i: int, env: gym.Env) -> None:
        """Give env i of split s the reward-shaping scheme of the policy its first agent plays for."""
        policy = learning_policy(self.cfg, int(self.agent_policy[s, i * self.num_agents]))
        scheme = dict(zip(self.shaping_keys, self.reward_shaping[policy].tolist()))
        env.get_wrapper_attr("set_reward_shaping")(scheme)
