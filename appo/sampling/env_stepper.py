"""The envs of one actor worker, by split: creating them, their first observations, stepping a split's envs with
the actions inference chose, and rebuilding an env that raised.

An exception inside one env's `step` or `reset` costs that env's episode, not the worker: the traceback is logged
(the first time this worker sees that error), the env is built anew and reset, and the step reports the episode
as ended.

Writes control.actors.call, call_env and call_since: which env call this worker is inside and since when, so the
runner can replace an actor stuck in one (--env_timeout_seconds). Torch-free.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback

import gymnasium as gym
import numpy as np

from appo.config.cfg import env_kwargs
from appo.envs import make_env
from appo.envs.action_masks import ActionMasks, NoLegalAction, random_actions
from appo.memory.buffers import TERMINATED, TRUNCATED
from appo.memory.control import MAKE, NO_CALL, RESET, STEP
from appo.spaces import to_env_action
from appo.utils.logs import log
from appo.utils.process import FatalError
from appo.utils.timing import Timing
from appo.workers.context import WorkerContext

# An env that raises is rebuilt and its error counted; one that raises in nearly every episode (at least
# FAILING_ENV_ERRORS errors, and FAILING_ENV_SHARE of the episodes this worker's envs ended or lost) trains on nothing
# but the steps before each error, and stops the run with the error.
FAILING_ENV_ERRORS, FAILING_ENV_SHARE = 100, 0.9


class EnvStepper:
    """Owns `envs[split][env]` of one worker; adds the time of its env steps to the worker's timing (env_step)."""

    def __init__(self, ctx: WorkerContext, worker: int, rng: np.random.Generator, timing: Timing):
        cfg, layout = ctx.cfg, ctx.layout
        self.cfg, self.worker, self.rng, self.timing = cfg, worker, rng, timing
        self.num_splits, self.agents_per_split, self.num_agents = layout.num_splits, layout.agents_per_split, \
            layout.num_agents
        self.envs_per_split = layout.agents_per_split // layout.num_agents
        self.env_kwargs = env_kwargs(cfg)
        actors = ctx.control.actors
        self.call, self.call_env, self.call_since = actors.call, actors.call_env, actors.call_since
        self.envs: list[list[gym.Env]] = []
        self.action_space: gym.Space | None = None
        self.plain_discrete = False  # one agent, a Discrete action from 0: the fast path of `_env_actions`
        self.turn_based = False  # a turn-based env (appo/envs/pettingzoo_turns.py): only the seat to move acts
        self.errors = 0  # env calls that raised since the last `take_errors`
        self.errors_seen: set[str] = set()  # distinct errors already logged with their traceback
        self.errors_in_all = self.episodes_ended = 0  # since the worker started: errors, episodes the envs ended
        # [split, env]: the env's episode began in the random steps of --decorrelate_envs_on_one_worker, whose
        # rewards nobody counted, so its end is no whole episode's return or length (EpisodeTracker skips it).
        self.midway = np.zeros((self.num_splits, self.envs_per_split), dtype=bool)

    def make_envs(self) -> None:
        self.envs = [[self._make(s, i) for i in range(self.envs_per_split)] for s in range(self.num_splits)]
        self._calling(NO_CALL, 0)
        self.action_space = self.envs[0][0].action_space
        self.turn_based = bool(getattr(self.envs[0][0], "turn_based", False))
        self.plain_discrete = (self.num_agents == 1 and isinstance(self.action_space, gym.spaces.Discrete)
                               and self.action_space.start == 0)

    def _calling(self, call: int, env: int) -> None:
        """Record that this worker enters an env call (NO_CALL: left it), for the runner's hang detection;
        `env` counts the worker's envs across splits. The call is written last, after its time and env."""
        w = self.worker
        self.call_since[w] = time.monotonic()
        self.call_env[w] = env
        self.call[w] = call

    def _make(self, s: int, i: int) -> gym.Env:
        self._calling(MAKE, s * self.envs_per_split + i)
        return make_env(self.cfg.env, self.env_kwargs, action_mask=self.cfg.action_mask,
                        random_opening_moves=self.cfg.random_opening_moves)

    # ---------------------------------------------------------------- first observations
    def first_observations(self, s: int) -> list:
        """Reset every env of split s (seeded when --seed is) and return their first observations."""
        observations = []
        for i, env in enumerate(self.envs[s]):
            self._calling(RESET, s * self.envs_per_split + i)
            observations.append(self._first_obs(s, i, env))
        self._calling(NO_CALL, 0)
        return observations

    def _env_seed(self, s: int, i: int) -> int | None:
        if self.cfg.seed is None:
            return None
        return self.cfg.seed + (self.worker * self.num_splits + s) * self.agents_per_split + i

    def _first_obs(self, s: int, i: int, env: gym.Env):
        """With --decorrelate_envs_on_one_worker the env first makes a random number of random steps; one of them
        that raises is an env error like any other (counted, the env rebuilt), so a flaky env starts."""
        obs, _ = env.reset(seed=self._env_seed(s, i))
        self.midway[s, i] = False
        if self.cfg.decorrelate_envs_on_one_worker:
            max_steps = (env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 1000)
            env.action_space.seed(int(self.rng.integers(2**31)))
            try:
                for _ in range(int(self.rng.integers(0, max_steps // 2 + 1))):
                    self.midway[s, i] = True
                    obs, _, terminated, truncated, _ = env.step(self._random_actions(env, obs))
                    if terminated or truncated:
                        obs, _ = env.reset()
                        self.midway[s, i] = False
                        break
            except Exception:
                obs = self._rebuild(s, i)
                self.midway[s, i] = False
        return obs

    def _random_actions(self, env: gym.Env, obs):
        """Uniformly random actions, among those the observation's action mask allows where it has one."""
        masked = obs if self.cfg.action_mask != "none" else None
        actions, _ = random_actions(env.action_space, masked, self.num_agents, self.rng)
        return actions if self.num_agents == 1 else np.stack(actions)

    # ---------------------------------------------------------------- stepping
    def step(self, s: int, actions: np.ndarray) -> tuple[list, list, list[tuple[int, int, dict]]]:
        """Step every env of split s with `actions` (one row per env-agent, as inference wrote them).

        Returns the rewards (one per env-agent, as the envs gave them), the observations (one per env: the next
        episode's first where one ended) and the envs that ended an episode: (env, done code, its last info).
        This runs thousands of times a second, with caches cold after each env's step (the env may sleep or
        wait, and other processes run meanwhile): the loop over envs only collects results in Python lists."""
        env_actions = self._env_actions(actions)
        a = self.num_agents
        rewards: list = []
        observations: list = []
        ended: list[tuple[int, int, dict]] = []
        started = time.perf_counter()
        w, call, call_env, call_since = self.worker, self.call, self.call_env, self.call_since
        first_env, clock = s * self.envs_per_split, time.monotonic
        call_since[w] = clock()  # written before the call it times (the runner may read at any moment)
        call[w] = STEP
        for i, env in enumerate(self.envs[s]):
            call_since[w], call_env[w] = clock(), first_env + i  # the timeout is per env call
            try:
                obs, reward, terminated, truncated, info = env.step(env_actions[i])
                if terminated or truncated:
                    self.episodes_ended += 1
                    ended.append((i, TERMINATED if terminated else TRUNCATED, info))
                    call[w] = RESET
                    obs, _ = env.reset()
                    call[w] = STEP
            except NoLegalAction as exc:  # a replacement env would meet it again: the run stops, saying where
                raise FatalError(str(exc)) from exc
            except Exception:
                obs, reward = self._rebuild(s, i), 0.0 if a == 1 else np.zeros(a)
                ended.append((i, TERMINATED, {}))
                self._calling(STEP, first_env + i)
            rewards.append(reward)
            observations.append(obs)
        call[w] = NO_CALL
        self.timing.add("env_step", time.perf_counter() - started)
        if a > 1:
            rewards = np.concatenate(rewards).tolist()  # [envs][agents] -> one per env-agent
        return rewards, observations, ended

    def _env_actions(self, actions: np.ndarray) -> list:
        """Per env, what its step takes: one agent's action, or a list with every agent's."""
        if self.plain_discrete:
            return actions.tolist()
        converted = [to_env_action(self.action_space, action) for action in actions]
        a = self.num_agents
        return converted if a == 1 else [converted[i:i + a] for i in range(0, len(converted), a)]

    def _rebuild(self, s: int, i: int):
        """Env i of split s raised: log it, build it anew, reset; returns its first observation.

        The traceback is logged the first time this worker sees an error (same exception, message and place);
        repeats are only counted (the status line shows the count), so a flaky env cannot flood the log."""
        self._count_error(f"env {i} of split {s} raised; rebuilding it")
        with contextlib.suppress(Exception):
            self.envs[s][i].close()
        env = self._make(s, i)
        self.envs[s][i] = env
        self._calling(RESET, s * self.envs_per_split + i)
        obs, _ = env.reset()
        return obs

    def _count_error(self, what: str) -> None:
        """Count the exception being handled; log it with its traceback the first time this worker sees it."""
        self.errors += 1
        self.errors_in_all += 1
        error = sys.exc_info()[1]
        frame = traceback.extract_tb(error.__traceback__)[-1]
        key = f"{type(error).__name__}: {error} at {frame.filename}:{frame.lineno}"
        lost = self.errors_in_all / (self.errors_in_all + self.episodes_ended)
        if self.errors_in_all >= FAILING_ENV_ERRORS and lost >= FAILING_ENV_SHARE:
            raise FatalError(f"its envs raised in {self.errors_in_all} of the "
                             f"{self.errors_in_all + self.episodes_ended} episodes they ended or lost ({key}); an env "
                             "that fails this often trains nothing (a rare error is only counted)")
        if key not in self.errors_seen:
            self.errors_seen.add(key)
            log.warning("actor %d: %s (repeats of this error are only counted):\n%s", self.worker, what,
                        traceback.format_exc())

    def take_errors(self) -> int:
        """Env calls that raised since the last call."""
        errors, self.errors = self.errors, 0
        return errors

    def take_illegal(self) -> int:
        """Actions the envs were given since the last call that their action masks did not allow."""
        return sum(env.take_illegal() for envs in self.envs for env in envs if isinstance(env, ActionMasks))

    def close(self) -> None:
        for envs in self.envs:
            for env in envs:
                env.close()
