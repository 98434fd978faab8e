"""Vectorised envs for batched sampling (`--batched_sampling`; `--env=envpool:<task id>` always): one object steps the
n sub-envs of an actor's split in one call, with arrays in and out.

Every env made here resets a sub-env whose episode ended within that same step (gymnasium's SAME_STEP autoreset):
the observation it returns for that sub-env is the next episode's first, as the per-env path has after its own
`reset()`. So a trajectory row after an end holds the new episode, and no step whose action an env ignores exists.
The sources differ in how they get there:

- a gymnasium id with a vector entry point (CartPole-v1): the entry point's env when it resets in the same step by
  itself. gymnasium's CartPole vector env resets on the NEXT step instead (that step ignores the sub-env's action and
  returns its first observation): `SameStepCartPole` resets the ended sub-envs at once, drawing their states as the
  env itself does. Other NEXT_STEP entry points, which gymnasium gives no way to reset some sub-envs alone, are
  stepped as "sync" (one line in the log says so);
- every other env the per-env path makes (gymnasium ids, atari_*, doom_*, registered names, module:function):
  gymnasium's SyncVectorEnv over `make_env` in SAME_STEP mode, so wrappers and preprocessing are the per-env path's;
- `envpool:<task id>`: an EnvPool pool in sync mode. EnvPool resets on the next step too; `EnvPoolSameStep` resets
  the ended sub-envs at once with EnvPool's partial reset, so their next step is an ordinary one.

Sub-env i of an env made with seed s is seeded s + i, as the per-env path seeds its envs. Torch-free.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper

from envs.registry import EnvError, gym_spec, make_env
from utils.logs import log

ENVPOOL_PREFIX = "envpool:"


def is_envpool_name(env_id: str) -> bool:
    return env_id.startswith(ENVPOOL_PREFIX)


def steps_batched(env_id: str, batched_sampling: bool) -> bool:
    """Whether actors step this env as one vectorised env per split: with --batched_sampling, and EnvPool always."""
    return batched_sampling or is_envpool_name(env_id)


def make_vector_env(env_id: str, num_envs: int, env_kwargs: dict[str, Any] | None = None,
                    seed: int | None = None) -> VectorEnv:
    """`num_envs` sub-envs of `--env` stepped as one, resetting ended sub-envs in the same step (module docstring).
    `seed` fixes EnvPool's sub-envs at creation; gymnasium's are seeded by `reset(seed=...)`."""
    kwargs = dict(env_kwargs or {})
    if is_envpool_name(env_id):
        return EnvPoolSameStep(make_envpool(env_id[len(ENVPOOL_PREFIX):], num_envs, kwargs, seed))
    entry_point = _vector_entry_point(env_id)
    if entry_point is not None:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if mode == AutoresetMode.SAME_STEP:
            return env
        if isinstance(env, CartPoleVectorEnv):
            return SameStepCartPole(env)
        env.close()
        log.info("%s: its vector entry point %s resets on the next step and cannot reset some sub-envs alone; "
                 "stepping %d envs as a gymnasium SyncVectorEnv instead", env_id, entry_point, num_envs)
    return SyncVectorEnv([lambda: make_env(env_id, kwargs)] * num_envs, copy=False,
                         autoreset_mode=AutoresetMode.SAME_STEP)


def _vector_entry_point(env_id: str) -> str | None:
    """The vector entry point of a gymnasium id, None for any other `--env`."""
    spec = gym_spec(env_id)
    return None if spec is None or spec.vector_entry_point is None else str(spec.vector_entry_point)


def sub_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Sub-env i's part of a vector env's info (arrays with `_key` masks, nested dicts alike)."""
    part = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        part[key] = sub_info(value, i) if isinstance(value, dict) else value[i]
    return part


def last_step_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Sub-env i's info of the step that ended its episode: a SAME_STEP env keeps it in `final_info` (its `info` is
    then the next episode's reset info)."""
    final = info.get("final_info")
    return sub_info(final if final is not None else info, i)


class SameStepCartPole(VectorWrapper):
    """gymnasium's CartPole vector env resetting an ended sub-env within the step that ended it, where the env itself
    would reset it at the next step and ignore that step's action. The new state is drawn as the env draws it
    (uniform in [low, high] from its np_random); the step counter restarts."""

    def __init__(self, env: CartPoleVectorEnv):
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        cartpole: CartPoleVectorEnv = self.env
        obs, rewards, terminated, truncated, info = cartpole.step(actions)
        ended = terminated | truncated
        if ended.any():
            cartpole.state[:, ended] = cartpole.np_random.uniform(cartpole.low, cartpole.high,
                                                                  size=(4, int(ended.sum())))
            cartpole.steps[ended] = 0
            cartpole.prev_done[:] = False  # nothing is left to reset at the next step
            obs[ended] = cartpole.state[:, ended].T
        return obs, rewards, terminated, truncated, info


# ---------------------------------------------------------------- EnvPool
def make_envpool(task_id: str, num_envs: int, kwargs: dict[str, Any], seed: int | None) -> VectorEnv:
    """An EnvPool pool of `num_envs` sub-envs in sync mode with the gymnasium API; `kwargs` go to envpool.make."""
    try:
        import envpool
    except ModuleNotFoundError as exc:
        raise EnvError(f'--env={ENVPOOL_PREFIX}{task_id}: EnvPool is not installed; pip install -e ".[envpool]"') \
            from exc
    if task_id not in envpool.list_all_envs():
        raise EnvError(f"--env={ENVPOOL_PREFIX}{task_id}: EnvPool has no task {task_id!r}; envpool.list_all_envs() "
                       "lists them")
    seed = int(np.random.default_rng().integers(2**31)) if seed is None else seed  # EnvPool's default is fixed (42)
    return envpool.make(task_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, seed=seed, **kwargs)


def _put(obs: Any, ids: np.ndarray, rows: Any) -> None:
    if isinstance(obs, dict):
        for key, value in obs.items():
            value[ids] = rows[key]
    else:
        obs[ids] = rows


class EnvPoolSameStep(VectorWrapper):
    """An EnvPool pool (sync mode) that resets ended sub-envs within the step: EnvPool would reset them at the next
    step, ignoring that step's action; its partial reset (`reset(env_id)`) does it now, and clears the pending one."""

    def __init__(self, env: VectorEnv):
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}
        self.frames_per_step = int(env.config.get("frame_skip", 1))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Every sub-env; EnvPool's seeds are fixed when it is made, so `seed` is not used."""
        return self.env.reset()

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        ended = terminated | truncated
        if ended.any():
            ids = np.flatnonzero(ended).astype(np.int32)
            first, reset_info = self.env.reset(ids)
            _put(obs, np.asarray(reset_info["env_id"]), first)
        return obs, rewards, terminated, truncated, info


class EnvPoolEnv(gym.Env):
    """One EnvPool sub-env with the per-env gymnasium API: what `make_env("envpool:<task id>")` gives the runner (to
    read the spaces), enjoy and evaluation. Actors step EnvPool batched (appo/sampling/vector_stepper.py)."""

    def __init__(self, task_id: str, seed: int | None = None, **kwargs: Any):
        self.pool = make_envpool(task_id, 1, kwargs, seed)
        self.observation_space = self.pool.single_observation_space
        self.action_space = self.pool.single_action_space
        self.frames_per_step = int(self.pool.config.get("frame_skip", 1))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """A new episode; EnvPool's seed is fixed when it is made, so `seed` is not used."""
        obs, info = self.pool.reset()
        return _first(obs), sub_info(info, 0)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.pool.step(np.asarray([action]))
        return _first(obs), float(reward[0]), bool(terminated[0]), bool(truncated[0]), sub_info(info, 0)

    def close(self) -> None:
        self.pool.close()


def _first(obs: Any) -> Any:
    return {key: value[0] for key, value in obs.items()} if isinstance(obs, dict) else obs[0]
