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
- `envpool:<task id>`: an EnvPool pool in sync mode (Atari tasks with `atari_`'s preprocessing and game scores:
  `envpool_atari_kwargs`, `EnvPoolSameStep`). EnvPool resets on the next step too; `EnvPoolSameStep` steps the
  ended sub-envs alone at once, which resets them, so their next step is an ordinary one. Observations the models do
  not take as they are (FrozenLake's Discrete state, MiniGrid's Dict holding a Discrete direction) are given as the
  per-env path gives them (envs/observations.py, `VectorModelObservations`).

Sub-env i of an env made with seed s is seeded s + i, as the per-env path seeds its envs. Torch-free.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from appo.envs.atari import FRAME_SKIP, SCREEN_SIZE
from appo.envs.observations import is_model_space, model_observation, model_space
from appo.envs.registry import EnvError, guarded_step_seconds, gym_spec, make_env
from appo.utils.logs import log

ENVPOOL_PREFIX = "envpool:"
PROBE_SUB_ENVS = (16, 256)  # sub-envs a start-up measurement steps (sub_env_step_seconds)
CHEAP_PROBE_S = 1e-4  # a sub-env step under this on the first is measured again on more sub-envs


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
        pool = EnvPoolSameStep(make_envpool(env_id[len(ENVPOOL_PREFIX):], num_envs, kwargs, seed))
        return pool if is_model_space(pool.single_observation_space) else VectorModelObservations(pool)
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


def natively_vectorised(env_id: str) -> bool:
    """Whether `make_vector_env` steps this env's sub-envs in one native call (EnvPool, a gymnasium vector entry
    point), rather than one after another in a SyncVectorEnv, where a sub-env's step costs what a per-env step does."""
    return is_envpool_name(env_id) or _vector_entry_point(env_id) is not None


def sub_env_step_seconds(env_id: str, env_kwargs: dict[str, Any] | None = None) -> float | None:
    """What one sub-env's step costs when a vectorised env steps many at once, with random actions (None when making
    or stepping it fails: the workers meet the problem and report it). Measured on PROBE_SUB_ENVS[0] sub-envs, and
    on PROBE_SUB_ENVS[1] when that is cheap (a fixed cost per call spreads over more sub-envs); read at start-up to
    size the sampler and the learner (appo/config/auto.py)."""
    seconds = None
    for num_envs in PROBE_SUB_ENVS:
        try:
            env = make_vector_env(env_id, num_envs, env_kwargs, seed=0)
        except Exception:
            return None
        try:
            call_seconds = guarded_step_seconds(env, 1, batch_space(env.single_action_space, num_envs))
        finally:
            env.close()
        if call_seconds is None:
            return None
        seconds = call_seconds / num_envs
        if seconds >= CHEAP_PROBE_S:
            break
    return seconds


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
ALE_V5_MAX_FRAMES = 108_000  # ALE v5's time limit per game, which atari_ gets from ale-py


def envpool_atari_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """EnvPool Atari options matching `atari_`'s preprocessing (envs/atari.py), `kwargs` (--env_kwargs) over them.

    Same as `atari_`: 1..30 no-op frames at a game's start, frame skip 4 with the max over the last two frames,
    84x84 grayscale resized by OpenCV's INTER_AREA from ALE's grayscale palette, 4 stacked frames (4, 84, 84) uint8,
    a lost life ends the episode and the next reset goes on with the same game, rewards clipped to their sign, sticky
    actions off, the minimal action set, FIRE pressed after every reset in games that have it, and at most 108000
    frames per game (27000 steps). What EnvPool does differently (its atari_env.h):
    - its reset presses FIRE for one emulator frame, taken from the no-op budget (1..30 frames in all); `atari_`
      makes a whole FIRE step (4 frames) after 1..30 no-ops;
    - after a lost life it makes 1..30 no-op frames again before FIRE (atari_: one no-op step, 4 frames), and keeps
      the 3 older frames of the stack (atari_ fills the stack with the first frame of every life);
    - its 27000-step limit counts steps, not the no-op and FIRE frames of resets (ALE counts every frame);
    - rewards of reset frames are not counted in the game's score (atari_ counts them; they are 0 in Breakout);
    - it bundles its own ALE build, so emulation may differ from ale-py's in rare details."""
    options = {"noop_max": 30, "frame_skip": FRAME_SKIP, "stack_num": 4, "img_height": SCREEN_SIZE,
               "img_width": SCREEN_SIZE, "gray_scale": True, "use_inter_area_resize": True, "episodic_life": True,
               "zero_discount_on_life_loss": False, "reward_clip": True, "repeat_action_probability": 0.0,
               "full_action_space": False, "use_fire_reset": True, **kwargs}
    options.setdefault("max_episode_steps", ALE_V5_MAX_FRAMES // options["frame_skip"])
    return options


# EnvPool Atari's options for one episode per whole game, scored unclipped: what training records (a game's
# info["true_episode_reward"]), for evaluation and enjoy (appo.envs.registry.whole_game_kwargs).
ENVPOOL_ATARI_WHOLE_GAMES = {"episodic_life": False, "reward_clip": False}


def is_envpool_atari(task_id: str) -> bool:
    """Whether `task_id` is one of EnvPool's Atari tasks (its module is envpool.atari); False without EnvPool."""
    try:
        from envpool.registration import registry
    except ModuleNotFoundError:
        return False
    spec = registry.specs.get(task_id)
    return spec is not None and spec[0] == "envpool.atari"


def make_envpool(task_id: str, num_envs: int, kwargs: dict[str, Any], seed: int | None) -> VectorEnv:
    """An EnvPool pool of `num_envs` sub-envs in sync mode with the gymnasium API; `kwargs` go to envpool.make, over
    `envpool_atari_kwargs`' for an Atari task."""
    try:
        import envpool
    except ModuleNotFoundError as exc:
        raise EnvError(f'--env={ENVPOOL_PREFIX}{task_id}: EnvPool is not installed; pip install -e ".[envpool]"') \
            from exc
    if task_id not in envpool.list_all_envs():
        raise EnvError(f"--env={ENVPOOL_PREFIX}{task_id}: EnvPool has no task {task_id!r}; envpool.list_all_envs() "
                       "lists them")
    if is_envpool_atari(task_id):
        kwargs = envpool_atari_kwargs(kwargs)
    seed = int(np.random.default_rng().integers(2**31)) if seed is None else seed  # EnvPool's default is fixed (42)
    return envpool.make(task_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, seed=seed, **kwargs)


def _rows(batch: Any, ids: Any) -> Any:
    """Rows `ids` of a batch (an array or a dict of arrays)."""
    return {key: value[ids] for key, value in batch.items()} if isinstance(batch, dict) else batch[ids]


def _put(obs: Any, ids: np.ndarray, rows: Any) -> None:
    if isinstance(obs, dict):
        for key, value in obs.items():
            value[ids] = rows[key]
    else:
        obs[ids] = rows


GAME_STATE = {"info:lives", "info:reward", "info:terminated"}  # EnvPool Atari's: lives, unclipped reward, game over
Restart = tuple[np.ndarray, Any, dict[str, Any]]  # ended sub-envs, their next episode's first observations, reset info


class EnvPoolSameStep(VectorWrapper):
    """An EnvPool pool (sync mode) that resets ended sub-envs within the step: EnvPool would reset them at the next
    step, ignoring that step's action, so the ended ones are stepped at once, alone (their actions ignored). That
    reset is EnvPool's own: after a lost life (Atari's episodic_life) it goes on with the same game, where an
    explicit `reset(env_id)` would start a new game.

    Atari (a pool whose info has `GAME_STATE`): the whole game's unclipped score (EnvPool's info["reward"] summed) goes
    in info["true_episode_reward"] (masked by info["_true_episode_reward"]) at a game's end: game over
    (info["terminated"]), the time limit, or a game over within the no-ops after a lost life (the lives then go up).
    `reports_true_episode_reward` tells the episode tracker to record games, not lives."""

    def __init__(self, env: VectorEnv):
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}
        self.frames_per_step = int(env.config.get("frame_skip", 1))
        self.reports_true_episode_reward = env.spec.state_array_spec.keys() >= GAME_STATE
        self.scores = np.zeros(env.num_envs)  # unclipped score of each sub-env's game so far

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Every sub-env (a new game); EnvPool's seeds are fixed when it is made, so `seed` is not used."""
        self.scores[:] = 0.0
        return self.env.reset()

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated, info, restart = self.step_and_restart(actions)
        if restart is not None:
            _put(obs, restart[0], restart[1])
        return obs, rewards, terminated, truncated, info

    def step_and_restart(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any],
                                                      Restart | None]:
        """`step`, with the observations of the step itself and the next episodes' apart (None if none ended)."""
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        ended = terminated | truncated
        restart = None
        if ended.any():
            ids = np.flatnonzero(ended).astype(np.int32)
            first, _, _, _, reset_info = self.env.step(_rows(actions, ids), ids)  # their actions are ignored
            restart = (reset_info["env_id"], first, reset_info)
        if self.reports_true_episode_reward:
            self._end_games(info, truncated, restart)
        return obs, rewards, terminated, truncated, info, restart

    def _end_games(self, info: dict[str, Any], truncated: np.ndarray, restart: Restart | None) -> None:
        self.scores += info["reward"]
        game_over = truncated | (info["terminated"] != 0)
        if restart is not None:
            ids, _, reset_info = restart
            game_over[ids] |= reset_info["lives"] > info["lives"][ids]
        if game_over.any():
            info["true_episode_reward"], info["_true_episode_reward"] = self.scores.copy(), game_over
            self.scores[game_over] = 0.0


class VectorModelObservations(VectorWrapper):
    """A vectorised env whose observations are given as the models see them, sub-env by sub-env as the per-env path's
    ModelObservations gives them (envs/observations.py): for EnvPool's tasks that observe a Discrete state (its toy
    text and MiniGrid tasks, whose steps are cheap), not its Atari ones, whose images the models take as they are.
    (gymnasium's VectorObservationWrapper refuses SAME_STEP envs, whose info may hold final observations; EnvPool's
    holds none.)"""

    def __init__(self, env: VectorEnv):
        super().__init__(env)
        self.given_space = env.single_observation_space
        self.given_batch = batch_space(self.given_space, env.num_envs)  # EnvPool's observation_space is one sub-env's
        self.single_observation_space = model_space(self.given_space)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return self.observations(obs), info

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        return self.observations(obs), rewards, terminated, truncated, info

    def observations(self, observations: Any) -> Any:
        """A batch of the env's observations as the models see them."""
        rows = [model_observation(self.given_space, row) for row in iterate(self.given_batch, observations)]
        return concatenate(self.single_observation_space, rows, create_empty_array(self.single_observation_space,
                                                                                   len(rows)))


class EnvPoolEnv(gym.Env):
    """One EnvPool sub-env with the per-env gymnasium API: what `make_env("envpool:<task id>")` gives the runner (to
    read the spaces), enjoy and evaluation. Actors step EnvPool batched (appo/sampling/vector_stepper.py). An ended
    episode's successor is started by EnvPool within the step (EnvPoolSameStep) and handed out by the next `reset`,
    so an Atari game goes on after a lost life; game scores come in info as with EnvPoolSameStep."""

    def __init__(self, task_id: str, seed: int | None = None, **kwargs: Any):
        self.pool = EnvPoolSameStep(make_envpool(task_id, 1, kwargs, seed))
        self.observation_space = self.pool.single_observation_space
        self.action_space = self.pool.single_action_space
        self.frames_per_step = self.pool.frames_per_step
        self.reports_true_episode_reward = self.pool.reports_true_episode_reward
        self.next_episode: tuple[Any, dict[str, Any]] | None = None  # started when the last one ended

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """The episode that followed the one that ended, else a new game; EnvPool's seed is fixed when it is made,
        so `seed` is not used."""
        if self.next_episode is not None:
            episode, self.next_episode = self.next_episode, None
            return episode
        obs, info = self.pool.reset()
        return _rows(obs, 0), sub_info(info, 0)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info, restart = self.pool.step_and_restart(np.asarray([action]))
        if restart is not None:
            self.next_episode = _rows(restart[1], 0), sub_info(restart[2], 0)
        return _rows(obs, 0), float(reward[0]), bool(terminated[0]), bool(truncated[0]), sub_info(info, 0)

    def close(self) -> None:
        self.pool.close()
