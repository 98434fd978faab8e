"""Episode bookkeeping of one actor worker: running returns and lengths, the episodes and games that ended, the PBT
objective of each, and the rewards that were not finite.

Writes no shared memory. Reads control.actors.agent_policy (who plays each env-agent) and traj.policy_versions
(which snapshot version played, to name the players of a game). What it gathers leaves in the worker's
`ActorReport`; records are built only when an episode ends, never per step. Torch-free.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from appo.config.topology import num_acting_ids
from appo.envs.info import extra_stats, for_agent
from appo.messages import EpisodeEnd, GameEnd
from appo.population.matchmaking import acting_name
from appo.utils.logs import log
from appo.workers.context import WorkerContext


class EpisodeTracker:
    """Per split, the return and first step of every env-agent's current episode (agent j of a split is agent
    j % num_agents of env j // num_agents); the episodes and games that ended since the last `take()`; how many
    non-finite rewards were stored as 0."""

    def __init__(self, ctx: WorkerContext, worker: int, batched: bool = False):
        cfg, layout = ctx.cfg, ctx.layout
        self.cfg, self.worker, self.num_agents = cfg, worker, layout.num_agents
        self.num_acting = num_acting_ids(cfg)
        self.agent_policy = ctx.control.actors.agent_policy[worker]  # [split, agent]
        self.policy_versions = ctx.traj.policy_versions
        n = layout.agents_per_split
        # Python lists for a few envs stepped one by one (cheaper than numpy per element); arrays for a vectorised
        # env's split (`batched`: `add_reward_array` adds a whole step in one operation).
        self.returns = [np.zeros(n) if batched else [0.0] * n for _ in range(layout.num_splits)]  # [split][agent]
        self.starts = [np.zeros(n, dtype=np.int64) if batched else [0] * n  # the split step its episode started at
                       for _ in range(layout.num_splits)]
        self.steps = [0] * layout.num_splits  # steps each split made
        self.episodes: list[EpisodeEnd] = []
        self.games: list[GameEnd] = []  # multi-agent envs played by more than one acting id, for the ratings
        self.nonfinite = 0
        self.nonfinite_reported: set[tuple[int, int]] = set()  # (split, env) already logged
        # [split, env]: the env has ended an episode since this worker started (see `every_env_ended`).
        self.ended_once = np.zeros((layout.num_splits, n // self.num_agents), dtype=bool)
        self.all_ended_once = False
        # [split, env]: the env's current episode began before its rewards were counted (the stepper's `midway`):
        # its end restarts the count and records nothing.
        self.midway = np.zeros_like(self.ended_once)

    def add_rewards(self, s: int, rewards: list[float]) -> list[float]:
        """Count one step of split s with its rewards (one per env-agent); returns the rewards to store.

        Non-finite rewards become 0 (learning from them would poison every statistic); each env that gives one
        is logged once and every such reward counted (the status line shows the count)."""
        if not math.isfinite(sum(rewards)):
            rewards = self._sanitize(s, rewards)
        returns = self.returns[s]
        for j, reward in enumerate(rewards):
            returns[j] += reward
        self.steps[s] += 1
        return rewards

    def add_reward_array(self, s: int, rewards: np.ndarray) -> np.ndarray:
        """`add_rewards` for a batched split (one array of rewards, one per sub-env), in numpy operations."""
        if not np.isfinite(rewards).all():
            rewards = np.asarray(self._sanitize(s, rewards.tolist()))
        self.returns[s] += rewards
        self.steps[s] += 1
        return rewards

    def _sanitize(self, s: int, rewards: list[float]) -> list[float]:
        clean = []
        for j, reward in enumerate(rewards):
            if not math.isfinite(reward):
                self.nonfinite += 1
                env = j // self.num_agents
                if (s, env) not in self.nonfinite_reported:
                    self.nonfinite_reported.add((s, env))
                    log.warning("actor %d: env %d of split %d returned a non-finite reward (%s); it is stored as 0 "
                                "(further ones from this env are only counted)", self.worker, env, s, reward)
                reward = 0.0
            clean.append(reward)
        return clean

    def end_episode(self, s: int, i: int, env: gym.Env, info: dict, slots: np.ndarray, t: int) -> None:
        """Env i of split s ended an episode with step t of `slots` (`info`: its last step's): record the episode
        of each of its agents (a learning policy's; a snapshot's are only rated) and the game, and start counting
        the next. Call it before the agents are mapped to the next episode's players.

        Envs that end an episode per life (Atari) report the whole game's score as
        `info["true_episode_reward"]` at its end; for them only game ends are recorded."""
        true_score = info.get("true_episode_reward")
        if true_score is None and getattr(env, "reports_true_episode_reward", False):
            return  # a life lost, not a game over: keep counting the game's return and length
        a, policies, returns, starts = self.num_agents, self.agent_policy[s], self.returns[s], self.starts[s]
        if self.midway[s, i]:
            self.midway[s, i] = False
            for j in range(i * a, (i + 1) * a):
                returns[j], starts[j] = 0.0, self.steps[s]
            return
        objective = info.get("true_objective")
        per_agent = isinstance(objective, (list, tuple, np.ndarray))  # a game's score (Doom: frags), else the return
        scores = []
        self.ended_once[s, i] = True
        for j in range(i * a, (i + 1) * a):
            reward = float(returns[j] if true_score is None else true_score)
            scores.append(float(objective[j - i * a]) if per_agent else reward)
            if policies[j] < self.cfg.num_policies:
                extra = extra_stats(info, j - i * a)
                self.episodes.append(EpisodeEnd(int(policies[j]), reward, int(self.steps[s] - starts[j]),
                                                self._objective(info, extra, reward, j - i * a), extra))
            returns[j] = 0.0
            starts[j] = self.steps[s]
        if a > 1 and self.num_acting > 1:
            players = policies[i * a:(i + 1) * a].tolist()
            versions = self.policy_versions[slots[i * a:(i + 1) * a], t].tolist()
            self.games.append(GameEnd([acting_name(self.cfg, p, v) for p, v in zip(players, versions)], scores))

    def end_sub_envs(self, s: int, ended: list[int], infos: list[dict], envs: list[gym.Env], slots: np.ndarray,
                     t: int) -> None:
        """`end_episode` for sub-envs `ended` of batched split s (one agent each; `infos`: their last step's, `envs`:
        the split's sub-envs). Where no info holds what `end_episode` reads and the env counts no lives (so an
        episode's return is its score and its objective), the episodes are recorded in numpy operations: a
        vectorised env of thousands of sub-envs ends tens of episodes per step."""
        keys = ("true_episode_reward", "true_objective", "episode_extra_stats", self.cfg.pbt_target_objective)
        informative = any(info and any(key in info for key in keys) for info in infos)
        if informative or getattr(envs[0], "reports_true_episode_reward", False):
            for i, info in zip(ended, infos):
                self.end_episode(s, i, envs[i], info, slots, t)
            return
        index = np.asarray(ended)
        returns, starts = self.returns[s], self.starts[s]
        midway = self.midway[s, index]
        if midway.any():  # sub-envs ended one agent each: env i's return is returns[i]
            returns[index[midway]], starts[index[midway]], self.midway[s, index] = 0.0, self.steps[s], False
            index = index[~midway]
        rewards, lengths = returns[index].tolist(), (self.steps[s] - starts[index]).tolist()
        by_return = self.cfg.pbt_target_objective == "true_objective"  # the objective: the return, else none
        self.episodes += [EpisodeEnd(policy, reward, length, reward if by_return else None, {})
                          for policy, reward, length in zip(self.agent_policy[s][index].tolist(), rewards, lengths)
                          if policy < self.cfg.num_policies]
        returns[index] = 0.0
        starts[index] = self.steps[s]
        self.ended_once[s, index] = True

    def _objective(self, info: dict, extra: dict[str, float], episode_reward: float, agent: int) -> float | None:
        """What PBT ranks policies by (--pbt_target_objective): by default the env's `info["true_objective"]`
        at the episode's end, else the episode's return; or any numeric value the last step's info (or its
        `episode_extra_stats`) names. A list there holds one value per agent (`agent` is the env's agent)."""
        name = self.cfg.pbt_target_objective
        if name == "true_objective":
            value = for_agent(info.get("true_objective", episode_reward), agent)
            return episode_reward if value is None else float(value)
        value = for_agent(info.get(name, extra.get(name)), agent)
        return float(value) if isinstance(value, (int, float, np.number)) else None

    def every_env_ended(self) -> bool:
        """Whether each env of this worker has ended an episode (a game, for envs with lives) since it started. Until
        then the episodes that ended are biased toward short ones: every env started at once, and the long episodes
        are still running. The runner judges targets and PBT only once every worker says so."""
        if not self.all_ended_once:
            self.all_ended_once = bool(self.ended_once.all())
        return self.all_ended_once

    def take(self) -> tuple[list[EpisodeEnd], list[GameEnd], int]:
        """The episodes, games and non-finite reward count since the last call."""
        taken = self.episodes, self.games, self.nonfinite
        self.episodes, self.games, self.nonfinite = [], [], 0
        return taken
