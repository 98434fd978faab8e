"""The envs of one actor worker with batched sampling: per split ONE vectorised env of `--num_envs_per_worker /
--worker_num_splits` sub-envs (envs/vector.py), stepped in one call with the actions of the whole split.

The public surface is EnvStepper's (env_stepper.py), so the actor picks one of the two; what differs is the shape
of what comes back: `first_observations` and `step` give the split's observations as ONE batch (an array, or a
dict of arrays, with one row per sub-env, which the actor writes into the trajectory in one operation) and the
rewards as one array. Every env made in envs/vector.py resets an ended sub-env within the step that ended it, so
the batch row of a sub-env whose episode ended holds the next episode's first observation, as the per-env path's
does. Sub-env i of split s is seeded as env i of split s is in the per-env path.

An exception inside the vectorised env's `step` or `reset` costs every sub-env of that split its episode: the
traceback is logged (the first time this worker sees that error), the vectorised env is built anew and reset, and
the step reports every sub-env's episode as ended. Writes control.actors.call, call_env (the split's first env) and
call_since, as EnvStepper does. Torch-free.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from appo.envs.vector import last_step_info, make_vector_env
from appo.memory.buffers import TERMINATED, TRUNCATED
from appo.memory.control import MAKE, NO_CALL, RESET, STEP
from appo.sampling.env_stepper import EnvStepper
from appo.spaces import action_layout
from appo.utils.timing import Timing
from appo.workers.context import WorkerContext


def to_env_actions(space: gym.Space, actions: np.ndarray) -> Any:
    """Stored action rows (one per sub-env) as a vectorised env takes them: the batched form of
    appo.spaces.to_env_action (Box parts clipped to their bounds)."""
    if isinstance(space, gym.spaces.Discrete):
        actions = np.asarray(actions, dtype=np.int64)  # no copy for a Discrete space's own (int64) rows
        return actions + int(space.start) if space.start else actions
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (actions.reshape(len(actions), *space.shape) + space.start).astype(space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return actions.reshape(len(actions), *space.shape).astype(space.dtype)
    if isinstance(space, gym.spaces.Box):
        return np.clip(actions.reshape(len(actions), *space.shape), space.low, space.high).astype(space.dtype)
    parts, offset = [], 0
    for sub in space.spaces:
        shape = action_layout(sub)[0]
        size = shape[0] if shape else 1
        chunk = actions[:, offset:offset + size]
        parts.append(to_env_actions(sub, chunk[:, 0] if isinstance(sub, gym.spaces.Discrete) else chunk))
        offset += size
    return tuple(parts)


class VectorStepper(EnvStepper):
    """Owns `vector_envs[split]` of one worker; `envs[split][i]` is sub-env i where the vectorised env has separate
    sub-envs (SyncVectorEnv: for reward shaping and per-life games), else the vectorised env itself."""

    def __init__(self, ctx: WorkerContext, worker: int, rng: np.random.Generator, timing: Timing):
        super().__init__(ctx, worker, rng, timing)
        self.vector_envs: list[gym.vector.VectorEnv] = []

    def make_envs(self) -> None:
        self.vector_envs = [self._make_vector(s) for s in range(self.num_splits)]
        self._calling(NO_CALL, 0)
        self.envs = [self._sub_envs(env) for env in self.vector_envs]
        self.action_space = self.vector_envs[0].single_action_space

    def _make_vector(self, s: int) -> gym.vector.VectorEnv:
        self._calling(MAKE, s * self.envs_per_split)
        seed = self._env_seed(s, 0)
        if seed is None:  # EnvPool fixes its seeds when it is made: one per split, not the same in every worker
            seed = int(self.rng.integers(2**31))
        return make_vector_env(self.cfg.env, self.envs_per_split, self.env_kwargs, seed)

    def _sub_envs(self, env: gym.vector.VectorEnv) -> list:
        return list(env.envs) if isinstance(env, gym.vector.SyncVectorEnv) else [env] * self.envs_per_split

    # ---------------------------------------------------------------- first observations
    def first_observations(self, s: int) -> Any:
        """Reset the split's vectorised env (sub-env i seeded as env i of the per-env path when --seed is) and return
        the batch of first observations. With --decorrelate_envs_on_one_worker the sub-envs then make a random number
        of random steps together (their episodes, of different lengths, spread them apart)."""
        self._calling(RESET, s * self.envs_per_split)
        env = self.vector_envs[s]
        obs, _ = env.reset(seed=self._env_seed(s, 0))
        self.midway[s] = False
        if self.cfg.decorrelate_envs_on_one_worker:
            actions = batch_space(env.single_action_space, self.envs_per_split)
            actions.seed(int(self.rng.integers(2**31)))
            try:  # as in the per-env path: a step that raises is an env error, counted, the env rebuilt
                for _ in range(int(self.rng.integers(0, self._max_episode_steps(env) // 2 + 1))):
                    obs = env.step(actions.sample())[0]
                    self.midway[s] = True  # every sub-env: one that ended restarted within the random steps
            except Exception:
                obs = self._rebuild_vector(s)
                self.midway[s] = False
        self._calling(NO_CALL, 0)
        return obs

    @staticmethod
    def _max_episode_steps(env: gym.vector.VectorEnv) -> int:
        """The sub-envs' time limit where their spec gives one, else 1000 (as EnvStepper assumes)."""
        sub_env = env.envs[0] if isinstance(env, gym.vector.SyncVectorEnv) else env.unwrapped
        steps = getattr(getattr(sub_env, "spec", None), "max_episode_steps", None)
        return steps if isinstance(steps, int) and steps > 0 else 1000

    # ---------------------------------------------------------------- stepping
    def step(self, s: int, actions: np.ndarray) -> tuple[np.ndarray, Any, list[tuple[int, int, dict]]]:
        """Step split s's vectorised env with `actions` (one row per sub-env, as inference wrote them) in one call.

        Returns the rewards (an array, one per sub-env), the observations (one batch: the next episode's first for
        a sub-env that ended) and the sub-envs that ended an episode: (sub-env, done code, its last step's info)."""
        started = time.perf_counter()
        w = self.worker
        self.call_since[w], self.call_env[w] = time.monotonic(), s * self.envs_per_split
        self.call[w] = STEP  # written last: the runner may read at any moment
        raised = False
        try:
            obs, rewards, terminated, truncated, info = self.vector_envs[s].step(
                to_env_actions(self.action_space, actions))
        except Exception:
            obs, raised = self._rebuild_vector(s), True
            rewards, terminated, truncated, info = (np.zeros(self.envs_per_split), np.ones(self.envs_per_split, bool),
                                                    np.zeros(self.envs_per_split, bool), {})
        self.call[w] = NO_CALL
        self.timing.add("env_step", time.perf_counter() - started)
        ended_envs = np.flatnonzero(terminated | truncated)
        if not len(ended_envs):
            return rewards, obs, []
        if not raised:
            self.episodes_ended += len(ended_envs)
        codes = np.where(terminated[ended_envs], TERMINATED, TRUNCATED).tolist()
        ended = [(i, code, last_step_info(info, i) if info else {}) for i, code in zip(ended_envs.tolist(), codes)]
        return rewards, obs, ended

    def _rebuild_vector(self, s: int) -> Any:
        """Split s's vectorised env raised: log it, build it anew, reset; returns its first observations.

        The traceback is logged the first time this worker sees an error (same exception, message and place);
        repeats are only counted."""
        self._count_error(f"the vectorised env of split {s} raised; rebuilding it, every sub-env's episode ends")
        with contextlib.suppress(Exception):
            self.vector_envs[s].close()
        self.vector_envs[s] = self._make_vector(s)
        self.envs[s] = self._sub_envs(self.vector_envs[s])
        self._calling(RESET, s * self.envs_per_split)
        obs, _ = self.vector_envs[s].reset()
        self._calling(STEP, s * self.envs_per_split)
        return obs

    def close(self) -> None:
        for env in self.vector_envs:
            env.close()
