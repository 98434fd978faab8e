"""Turn an `--env` string into an environment.

Resolution order:
1. `atari_<game>` names (`atari_breakout`, ...): ale-py with DeepMind preprocessing (`envs/atari.py`);
   `doom_<scenario>` names (`doom_basic`, ...): ViZDoom (`envs/doom/`);
   `envpool:<task id>` names (`envpool:Breakout-v5`): one EnvPool sub-env (`envs/vector.py`; actors step EnvPool
   batched, many sub-envs per call);
   names registered with `register_env(name, make_fn)` (the built-in synthetic and multi-agent envs
   are registered on import of `envs`; user code can add its own);
2. `package.module:function` where `function` is a callable in that module (a function, or a class such as a
   `gymnasium.Env` subclass): it is called with `--env_kwargs` to make the env; it must return an env.
   A PettingZoo `ParallelEnv` it returns (duck-typed: `possible_agents` and per-agent `observation_space(agent)`)
   is wrapped in `appo.envs.pettingzoo_env.PettingZooEnv`, one seat per possible agent, so PettingZoo's own make
   functions work as they are: `--env=mpe2.simple_spread_v3:parallel_env --env_kwargs='{"max_cycles": 25}'`
   (`pip install -e ".[pettingzoo]"`), `--env=pettingzoo.butterfly.pistonball_v6:parallel_env` (PettingZoo's
   families need their own extra as well: `pip install "pettingzoo[butterfly]"`); an AECEnv (turn-based:
   `--env=pettingzoo.classic.connect_four_v3:env`) is wrapped in `appo.envs.pettingzoo_turns.TurnBasedEnv`;
3. anything `gymnasium.make` accepts, including `package.module:EnvName-v0`, for which gymnasium imports
   `package.module` (which registers the env) first.

At launch the env is made for the first time in the main process (`env_info`): an exception its module, its make
function or its first reset and step raise is then one line naming `--env`, not a traceback; the workers, which make
and step it later, handle what it raises with their own restarts.

`--env_kwargs` (a JSON object) is passed to the make function or to `gymnasium.make`. Observations of routes 2 and 3
that are not a Box or a Dict of Boxes (Taxi's Discrete state, Blackjack's Tuple) are turned into ones
(`appo.envs.observations`). An env whose actions are masked (`--action_mask`) is wrapped in
`appo.envs.action_masks.ActionMasks`. Workers build envs through this same function, so every process resolves the
name the same way.
"""

from __future__ import annotations

import importlib
import json
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from appo.envs.contract import api_problem, describe, raised
from appo.spaces import MASK_KEY, SpaceError, gaussian_box, initial_stds, mask_size
from appo.utils.logs import log

NOISE_PROBE_STEPS = 2000  # two of HalfCheetah's episodes; Ant's last about 300 steps at the narrow std
SLOW_PROBE_S = 5.0  # a start-up probe that takes longer logs a line: the user sees why start-up is slow
PROBE_LIMIT_S = 5.0  # a probe of one reset and a few steps (`within`) that takes longer is given up
GAME_PROBE_MOVES = 2000  # random moves the turn-based game probe plays: about 95 connect four games, 260 tic-tac-toe


class EnvError(Exception):
    """The env cannot be made; the message names the flag value and what would be valid."""


_REGISTRY: dict[str, Callable[..., gym.Env]] = {}

# Env families whose packages are optional: the pip extra of this project that installs each.
EXTRAS = {"box2d": ("LunarLander", "BipedalWalker", "CarRacing"),
          "mujoco": ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid", "Swimmer", "Reacher", "Pusher",
                     "InvertedPendulum", "InvertedDoublePendulum")}
# gymnasium id namespaces whose ids a module registers when asked, and the extra of this project that installs it.
NAMESPACE_MODULES = {"ALE": ("ale_py", "atari")}
# Top-level modules of `package.module:function` envs that an extra of this project installs.
MODULE_EXTRAS = {"pettingzoo": "pettingzoo", "mpe2": "pettingzoo"}


def register_env(name: str, make_fn: Callable[..., gym.Env]) -> None:
    """Make `--env=name` call `make_fn(**env_kwargs)`; call it in a module the workers import too."""
    _REGISTRY[name] = make_fn


def _module_function(env_id: str) -> Callable[..., gym.Env] | None:
    """The callable that `package.module:function` names (route 2 of the module docstring); None where the name is
    one for gymnasium (`package.module:EnvName-v0`, or an id the module registers)."""
    if ":" not in env_id:
        return None
    module_name, attribute = env_id.split(":", 1)
    if not module_name:
        raise EnvError(f"--env={env_id}: no module before ':'; use 'package.module:function'")
    try:
        module = importlib.import_module(module_name)  # importlib: the module is the user's --env=module:function
    except ModuleNotFoundError as exc:
        raise EnvError(f"--env={env_id}: module {exc.name!r} not found; {_missing_hint(module_name, exc.name)}") \
            from exc
    except gym.error.DependencyNotInstalled as exc:  # e.g. pettingzoo.butterfly without pymunk: names its extra
        raise EnvError(f"--env={env_id}: a package it needs is missing ({exc})") from exc
    except Exception as exc:  # the module's own code raised (pettingzoo's hanabi_v5 without open_spiel: ImportError)
        raise EnvError(f"--env={env_id}: importing {module_name!r} raised {raised(exc)}") from exc
    candidate = getattr(module, attribute, None)
    if attribute in gym.registry and (candidate is None or isinstance(candidate, type)):
        return None  # gymnasium makes its registered id, with the spec's wrappers (time limit)
    if callable(candidate):
        return candidate
    if candidate is None and attribute.isidentifier():
        raise EnvError(f"--env={env_id}: module {module_name!r} has no attribute {attribute!r}; name a function or "
                       "class that makes the env, or an id the module registers with gymnasium")
    if candidate is not None:
        raise EnvError(f"--env={env_id}: {attribute!r} of module {module_name!r} is {describe(candidate)}, not a "
                       "function or class that makes the env")
    return None


def _missing_hint(module_name: str, missing: str | None) -> str:
    """What to install when importing `module_name` failed for want of `missing`: the project's extra when that
    extra installs it (pettingzoo, mpe2 and mpe2's dependencies), PettingZoo's own extra for a family's dependency
    (pymunk for pettingzoo.butterfly), else the missing name."""
    top, missing = module_name.split(".")[0], missing or module_name
    missing_top = missing.split(".")[0]
    if missing_top == top and missing != top:
        return "fix the module path"  # the package is there, the module is not
    # PettingZoo's families need PettingZoo's extras (pettingzoo[butterfly]); mpe2's dependencies come with ours.
    extra = MODULE_EXTRAS.get(missing_top) or (MODULE_EXTRAS.get(top) if top != "pettingzoo" else None)
    if extra:
        return f'pip install -e ".[{extra}]"'
    if top == "pettingzoo" and "." in module_name:
        return f'install it (pip install "pettingzoo[{module_name.split(".")[1]}]")'
    return "install it or fix the module path" if missing == top else "install it"


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None, render_mode: str | None = None,
             action_mask: str = "auto", random_opening_moves: int = 0) -> gym.Env:
    """A new env for `--env` (resolved as the module docstring says), its action masks (`--action_mask`) in the
    observation and checked (envs/action_masks.py); workers call it too, so they all agree. A turn-based game starts
    each game after up to `random_opening_moves` random legal moves (envs/pettingzoo_turns.py); other envs have no
    openings and ignore it (the launch refuses the flag for them)."""
    from appo.envs.action_masks import ActionMasks, mask_source

    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        env = _make_unmasked(env_id, kwargs)
    except TypeError as exc:
        problem = _argument_problem(exc, kwargs)
        if problem is None:
            raise
        raise EnvError(f"--env={env_id}: {problem}") from exc
    turn_based = bool(getattr(env, "turn_based", False))
    if turn_based:
        env.unwrapped.random_opening_moves = random_opening_moves
    # A turn-based env's masks are always in its observation (pettingzoo_turns.py puts them there).
    masked_turns = turn_based and action_mask != "none"
    source = ("obs", MASK_KEY) if masked_turns else mask_source(action_mask, env.observation_space)
    try:
        if source is None and turn_based:
            raise EnvError(f"--env={env_id}: a turn-based env tells each seat whose turn it is in its action mask; "
                           "--action_mask=none cannot apply (use auto)")
        return env if source is None else ActionMasks(env, source, env_id)
    except EnvError:
        env.close()
        raise


def _argument_problem(exc: TypeError, kwargs: dict[str, Any]) -> str | None:
    """What `--env_kwargs` got wrong, when the TypeError making an env says it: a key its make function does not
    take, or an argument it needs and was not given; None for any other TypeError (a fault of the env's own code)."""
    message = str(exc).split(" was raised from the environment creator")[0]  # gymnasium.make appends where it was
    unexpected = re.search(r"unexpected keyword argument '([^']+)'", message)
    if unexpected and unexpected.group(1) in kwargs:
        return f"--env_kwargs names {unexpected.group(1)!r}, which its make function does not take ({message})"
    if re.search(r"missing \d+ required (positional|keyword-only) argument", message):
        return f"its make function needs an argument --env_kwargs does not give ({message})"
    return None


def _make_unmasked(env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    from appo.envs.atari import is_atari_name, make_atari
    from appo.envs.doom import is_doom_name, make_doom
    from appo.envs.vector import ENVPOOL_PREFIX, EnvPoolEnv, is_envpool_name

    if is_atari_name(env_id):
        return make_atari(env_id, **kwargs)
    if is_doom_name(env_id):
        return make_doom(env_id, **kwargs)
    if is_envpool_name(env_id):
        return _with_model_observations(env_id, EnvPoolEnv(env_id[len(ENVPOOL_PREFIX):], **kwargs))
    make_fn = _REGISTRY.get(env_id) or _module_function(env_id)
    if make_fn is not None:
        return _with_model_observations(env_id, _as_gym_env(env_id, make_fn(**kwargs)))
    try:
        _register_namespace(env_id)
        # The passive checker costs ~30% of a CartPole step and only warns; workers step millions of times.
        env = gym.make(env_id, disable_env_checker=True, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        extra = next((name for name, families in EXTRAS.items() if env_id.split("/")[-1].startswith(families)), None)
        hint = f'pip install -e ".[{extra}]"' if extra else "install the package it names"
        raise EnvError(f"--env={env_id}: a package it needs is missing ({exc}); {hint}") from exc
    except gym.error.Error as exc:
        raise EnvError(f"--env={env_id}: cannot be made ({exc}); use a registered gymnasium id such as "
                       f"CartPole-v1, 'package.module:EnvName-v0', or one of {sorted(_REGISTRY)}") from exc
    except ModuleNotFoundError as exc:
        raise EnvError(f"--env={env_id}: module {exc.name!r} not found; install it or fix the module path") from exc
    except ImportError as exc:  # gymnasium's retired ids (Reacher-v2: mujoco-py) say what to install
        raise EnvError(f"--env={env_id}: cannot be made ({str(exc).strip().splitlines()[0]})") from exc
    return _with_model_observations(env_id, env)


def _register_namespace(env_id: str) -> None:
    """Register the gymnasium ids of a namespace whose package registers them only when asked: `ALE/Pong-v5`
    needs `gym.register_envs(ale_py)` (gymnasium's raw ALE env; `atari_pong` is the DeepMind preprocessing)."""
    namespace = env_id.split("/")[0] if "/" in env_id else None
    if namespace not in NAMESPACE_MODULES:
        return
    module_name, extra = NAMESPACE_MODULES[namespace]
    try:
        gym.register_envs(importlib.import_module(module_name))
    except ImportError as exc:
        raise EnvError(f'--env={env_id}: the {namespace} ids need {module_name}; pip install -e ".[{extra}]"') from exc


def _with_model_observations(env_id: str, env: gym.Env) -> gym.Env:
    """The env with its observations as the models take them (envs/observations.py); EnvError naming `--env` where
    they have no such form."""
    from appo.envs.observations import with_model_observations

    try:
        return with_model_observations(env)
    except SpaceError as exc:
        raise EnvError(f"--env={env_id}: {exc}") from exc


def gym_spec(env_id: str) -> gym.envs.registration.EnvSpec | None:
    """The gymnasium spec `make_env` makes `env_id` from; None when another route makes it (atari_, doom_,
    envpool:, registered names, make functions) or gymnasium does not know it."""
    from appo.envs.atari import is_atari_name
    from appo.envs.doom import is_doom_name
    from appo.envs.vector import is_envpool_name

    if env_id in _REGISTRY or is_atari_name(env_id) or is_doom_name(env_id) or is_envpool_name(env_id):
        return None
    try:
        return gym.spec(env_id)
    except (gym.error.Error, ModuleNotFoundError):
        return None


def whole_game_kwargs(env_id: str) -> dict[str, Any]:
    """The env kwargs (over --env_kwargs) under which one episode is one whole game, scored unclipped: evaluation and
    enjoy play with them, so that they score what training records of an env that ends an episode per lost life and
    clips rewards (a game's info["true_episode_reward"]). Empty for envs whose episodes are whole games already."""
    from appo.envs.atari import WHOLE_GAMES, is_atari_name
    from appo.envs.vector import ENVPOOL_ATARI_WHOLE_GAMES, ENVPOOL_PREFIX, is_envpool_atari, is_envpool_name

    if is_atari_name(env_id):
        return dict(WHOLE_GAMES)
    if is_envpool_name(env_id) and is_envpool_atari(env_id[len(ENVPOOL_PREFIX):]):
        return dict(ENVPOOL_ATARI_WHOLE_GAMES)
    return {}


def _as_gym_env(env_id: str, env: Any) -> gym.Env:
    """The env a make function returned, with a PettingZoo ParallelEnv or AECEnv wrapped into the multi-agent API."""
    from appo.envs.pettingzoo_env import PettingZooEnv, is_aec_env, is_parallel_env
    from appo.envs.pettingzoo_turns import TurnBasedEnv

    if is_parallel_env(env):
        try:
            return PettingZooEnv(env)
        except EnvError as exc:
            env.close()
            raise EnvError(f"--env={env_id}: {exc}") from exc
    if is_aec_env(env):
        try:
            return TurnBasedEnv(env, env_id)
        except EnvError as exc:
            env.close()
            raise EnvError(f"--env={env_id}: {exc}") from exc
    if not all(hasattr(env, name) for name in ("observation_space", "action_space", "reset", "step")):
        raise EnvError(f"--env={env_id}: its make function returned {describe(env)}, not an env (a gymnasium Env, or a "
                       "PettingZoo ParallelEnv or AECEnv)")
    return env


@dataclass(frozen=True)
class EnvInfo:
    """What the runner needs to know before it sizes buffers, read from a throw-away env instance."""

    obs_space: gym.Space  # of one agent
    action_space: gym.Space  # of one agent
    num_agents: int = 1
    frames_per_step: int = 1  # emulator frames per env step (frame skip), for reporting frames/s
    reward_shaping: dict[str, float] = field(default_factory=dict)  # the env's default coefficients, if any
    reward_shaping_bounds: dict[str, tuple[float, float]] = field(default_factory=dict)  # (low, high), if declared
    step_seconds: float | None = None  # one env step with random actions, when measured
    noise_terminations: tuple[int, int | None] | None = None  # early ends under noise at std 1 and narrower, probed
    shm_bytes_per_env: int = 0  # /dev/shm one env instance uses (Doom's engines), for the start-up check
    info_action_mask: bool = False  # an unmasked env's reset info holds an action mask (--action_mask=auto reads it)
    turn_based: bool = False  # seats take turns (envs/pettingzoo_turns.py)
    random_game_moves: float | None = None  # a turn-based game's mean length under random play, probed


def env_info(env_id: str, env_kwargs: dict[str, Any] | None = None, measure_step: bool = False,
             action_mask: str = "auto") -> EnvInfo:
    """What the runner needs to know about the env (its spaces as the model sees them: with the action mask that
    `action_mask` reads, make_env's); with `measure_step`, also what one step costs (see measure_step_seconds)."""
    env = _first_env(env_id, env_kwargs, action_mask)
    try:
        if getattr(env, "from_info", None) is not None:
            try:  # a mask missing from info, or of a wrong size: one line now (EnvError), not a worker crash
                env.reset(seed=0)
            except EnvError:
                raise
            except Exception as exc:
                raise EnvError(f"--env={env_id}: its reset raised {raised(exc)}") from exc
        num_agents = int(getattr(env, "num_agents", 1))
        turn_based = bool(getattr(env, "turn_based", False))
        if num_agents == 1 and not turn_based:  # multi-agent and turn-based envs speak this project's API
            problem = within(PROBE_LIMIT_S, lambda: api_problem(env, env.action_space.sample()))
            if problem:
                raise EnvError(f"--env={env_id}: {problem}")
        info_mask = action_mask == "auto" and num_agents == 1 and MASK_KEY not in obs_keys(env) and \
            reset_info_has_mask(env)
        step_seconds = guarded_step_seconds(env, num_agents) if measure_step else None
        return EnvInfo(env.observation_space, env.action_space, num_agents, int(getattr(env, "frames_per_step", 1)),
                       *reward_shaping(env), step_seconds=step_seconds,
                       shm_bytes_per_env=int(getattr(env, "shm_bytes_per_env", 0)), info_action_mask=info_mask,
                       turn_based=turn_based)
    finally:
        env.close()


def _first_env(env_id: str, env_kwargs: dict[str, Any] | None, action_mask: str) -> gym.Env:
    """make_env, the first time the env is made (at launch, in the main process): an exception its constructor raises
    there is the env's code or `--env_kwargs` at fault, one line (EnvError) rather than a traceback. Later makes (the
    workers') keep their own handling."""
    try:
        return make_env(env_id, env_kwargs, action_mask=action_mask)
    except EnvError:
        raise
    except Exception as exc:
        given = f" (--env_kwargs={json.dumps(env_kwargs)})" if env_kwargs else ""
        raise EnvError(f"--env={env_id}{given}: making it raised {raised(exc)}") from exc


def obs_keys(env: gym.Env) -> list[str]:
    space = env.observation_space
    return list(space.spaces) if isinstance(space, gym.spaces.Dict) else []


def reset_info_has_mask(env: gym.Env) -> bool:
    """Whether a single-agent env with Discrete or MultiDiscrete actions gives an action mask of the right size in the
    info of a reset (gymnasium's Taxi, info["action_mask"]): one reset, read by the start-up rules."""
    try:
        size = mask_size(env.action_space)
        _, info = env.reset(seed=0)
    except Exception:  # no discrete actions; or a reset that raises, which the workers will meet and report
        return False
    return MASK_KEY in info and np.size(info[MASK_KEY]) == size


def guarded_step_seconds(env: gym.Env, num_agents: int, actions: gym.Space | None = None,
                         limit_s: float = PROBE_LIMIT_S) -> float | None:
    """measure_step_seconds, or None when the env raises or (in the main thread) takes over `limit_s`: the
    workers then meet the problem and report it with their usual handling."""
    return within(limit_s, lambda: measure_step_seconds(env, num_agents, actions))


class _ProbeTimeout(BaseException):
    """`within`'s alarm: not an Exception, so that neither the env's own `except Exception` nor a probe that reports
    what the env raised (envs/contract.py) takes the time limit for the env's error."""


def within(limit_s: float, probe: Callable[[], Any]) -> Any:
    """`probe()`, or None when it raises or (in the main thread, where SIGALRM can interrupt it) runs over
    `limit_s`: a start-up probe of the env must not hang the launch."""
    in_main_thread = threading.current_thread() is threading.main_thread()

    def give_up(*_):
        raise _ProbeTimeout

    previous = signal.signal(signal.SIGALRM, give_up) if in_main_thread else None
    try:
        if in_main_thread:
            signal.setitimer(signal.ITIMER_REAL, limit_s)
        return probe()
    except (Exception, _ProbeTimeout):
        return None
    finally:
        if in_main_thread:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def measure_step_seconds(env: gym.Env, num_agents: int, actions: gym.Space | None = None, budget_s: float = 0.2,
                         max_steps: int = 100) -> float:
    """Mean wall time of env.step with random actions (drawn from `actions`, by default the env's action space;
    legal ones under an action mask, as the trainer plays), over at most `budget_s` or `max_steps` (and at least
    one step); resets are not counted. Read at start-up to size the sampler (appo/config/auto.py)."""
    from appo.envs.action_masks import random_actions  # (that module imports this one)

    obs, _ = env.reset(seed=0)
    actions = env.action_space if actions is None else actions
    actions.seed(0)
    rng = np.random.default_rng(0)
    stepping, steps, start = 0.0, 0, time.perf_counter()
    while steps == 0 or (steps < max_steps and time.perf_counter() - start < budget_s):
        action, _ = random_actions(actions, obs, num_agents, rng)
        before = time.perf_counter()
        obs, _, terminated, truncated, _ = env.step(action)
        stepping += time.perf_counter() - before
        steps += 1
        if np.all(terminated) or np.all(truncated):
            obs, _ = env.reset()
    return stepping / steps


def noise_terminations(env_id: str, env_kwargs: dict[str, Any] | None, narrow_std: float,
                       max_steps: int = NOISE_PROBE_STEPS) -> tuple[int, int | None] | None:
    """How many episodes actions of the model's initial Gaussian (centred on the action box, each dimension's std at
    most its half width, clipped to the box) end by termination (a body that fell, a pole that dropped; not a time
    limit) in `max_steps` env steps from seed 0: at std 1, and at `narrow_std` where std 1 ended any (else None: no
    noise ends this env's episodes early). None when making or stepping the env raises. Read at start-up by the rule on
    the Gaussian's initial std (appo/config/auto.py), so it plays every step however long they take: the answer, and
    the std, must not depend on how fast this machine is. Over SLOW_PROBE_S it says so, since start-up waits for it."""
    started = time.perf_counter()
    try:
        env = make_env(env_id, env_kwargs)
        try:
            wide = _terminations(env, 1.0, max_steps)
            return wide, (_terminations(env, narrow_std, max_steps) if wide else None)
        finally:
            env.close()
    except Exception:
        return None
    finally:
        seconds = time.perf_counter() - started
        if seconds > SLOW_PROBE_S:
            log.info("Noise probe: %d steps of %s at std 1 and %g took %.1f s (to see how often noise ends its "
                     "episodes early, for the Gaussian's initial std; the answer does not depend on the time)",
                     max_steps, env_id, narrow_std, seconds)


def random_game_moves(env_id: str, env_kwargs: dict[str, Any] | None,
                      max_moves: int = GAME_PROBE_MOVES) -> float | None:
    """A turn-based game's mean length in moves when every seat plays uniformly random legal moves, over the games
    begun within `max_moves` moves from seed 0 (the last one cut short there); None when making or playing it raises.
    Read at start-up by the random-openings rule (appo/config/auto.py): a fixed count of moves, not of seconds, so the
    answer does not depend on how fast this machine is."""
    from appo.envs.action_masks import random_actions  # (that module imports this one)

    try:
        env = make_env(env_id, env_kwargs)
        try:
            rng, lengths, moves = np.random.default_rng(0), [0], 0
            obs, _ = env.reset(seed=0)
            while moves < max_moves:
                actions, _ = random_actions(env.action_space, obs, env.num_agents, rng)
                obs, _, terminated, truncated, _ = env.step(actions)
                moves, lengths[-1] = moves + 1, lengths[-1] + 1
                if (terminated or truncated) and moves < max_moves:
                    obs, _ = env.reset(seed=len(lengths))
                    lengths.append(0)
            return float(np.mean([length for length in lengths if length]))
        finally:
            env.close()
    except Exception:
        return None


def _terminations(env: gym.Env, std: float, max_steps: int) -> int:
    rng = np.random.default_rng(0)
    sample = gaussian_sampler(env.action_space, std)
    num_agents = int(getattr(env, "num_agents", 1))
    env.reset(seed=0)
    ended = 0
    for _ in range(max_steps):
        actions = [sample(rng) for _ in range(num_agents)]
        _, _, terminated, truncated, _ = env.step(actions[0] if num_agents == 1 else actions)
        if np.any(terminated):
            ended += 1
        if np.any(terminated) or np.all(truncated):
            env.reset()
    return ended


def gaussian_sampler(space: gym.Space, std: float) -> Callable[[np.random.Generator], Any]:
    """Actions of the untrained model's Gaussian at the scalar std `std` (appo.spaces.initial_stds), clipped to the
    box; the box is read once, not at every action."""
    if isinstance(space, gym.spaces.Tuple):
        parts = [gaussian_sampler(part, std) for part in space.spaces]
        return lambda rng: tuple(sample(rng) for sample in parts)
    centre, half_width = gaussian_box(space)
    stds = initial_stds(std, half_width)
    return lambda rng: np.clip((centre + stds * rng.standard_normal(centre.size)).reshape(space.shape),
                               space.low, space.high).astype(space.dtype)


def reward_shaping(env: gym.Env) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """The env's reward-shaping coefficients and the ranges it declares for them, for envs (or wrappers) that
    implement the interface PBT uses: `get_reward_shaping() -> dict[str, float]` and `set_reward_shaping(scheme)`,
    which takes effect from the next step; optionally `get_reward_shaping_bounds() -> {name: (low, high)}`,
    the range PBT keeps each coefficient in. Both empty for every other env."""
    try:
        getter = env.get_wrapper_attr("get_reward_shaping")
    except AttributeError:
        return {}, {}
    coefficients = {str(key): float(value) for key, value in getter().items()}
    try:
        declared = env.get_wrapper_attr("get_reward_shaping_bounds")()
    except AttributeError:
        declared = {}
    bounds = {}
    for key, (low, high) in declared.items():
        if key not in coefficients or not float(low) <= float(high):
            raise ValueError(f"get_reward_shaping_bounds(): {key!r}: ({low}, {high}) must be (low, high) of one of "
                             f"the coefficients of get_reward_shaping(), {sorted(coefficients)}")
        bounds[str(key)] = (float(low), float(high))
    return coefficients, bounds
