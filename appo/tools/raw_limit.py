"""The raw limit of an env, and a sampler-only trainer run to hold against it (benchmark mode, scripts/bench_sampler.py,
bench_scaling.py, bench_cluster.py).

The raw limit is what plain processes reach stepping the same envs with random actions and nothing
else (no trainer, no inference, no shared memory): the ceiling the trainer is held against.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from appo.envs import env_info, make_env
from appo.envs.action_masks import random_actions
from appo.tools.trainer_process import run_trainer


def _step_envs(env_id: str, env_kwargs: dict, num_envs: int, seconds: float, start_at: float, counts, index: int
               ) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    envs = [make_env(env_id, env_kwargs) for _ in range(num_envs)]
    num_agents = int(getattr(envs[0], "num_agents", 1))
    rng = np.random.default_rng(index)
    observations = []
    for env in envs:
        observations.append(env.reset()[0])
        env.action_space.seed(index)
    time.sleep(max(0.0, start_at - time.time()))
    steps, deadline = 0, time.time() + seconds
    while time.time() < deadline:
        for i, env in enumerate(envs):
            action, acting = random_actions(env.action_space, observations[i], num_agents, rng)
            obs, _, terminated, truncated, _ = env.step(action)
            observations[i] = env.reset()[0] if terminated or truncated else obs
            steps += acting
    counts[index] = steps


def _step_vector_envs(env_id: str, env_kwargs: dict, num_envs: int, num_splits: int, seconds: float, start_at: float,
                      counts, index: int) -> None:
    """One plain process: `num_splits` vectorised envs of `num_envs / num_splits` sub-envs, stepped in turn with
    random actions (drawn up front: the sampler's actions come from inference, not from the actor)."""
    from gymnasium.vector.utils import batch_space
    from threadpoolctl import threadpool_limits

    from appo.envs.vector import make_vector_env
    from appo.sampling.vector_stepper import to_env_actions

    threadpool_limits(1)
    per_split = max(1, num_envs // num_splits)
    envs = [make_vector_env(env_id, per_split, env_kwargs, seed=(index * num_splits + s) * per_split)
            for s in range(num_splits)]
    space = batch_space(envs[0].single_action_space, per_split)
    space.seed(index)
    actions = [to_env_actions(envs[0].single_action_space, space.sample()) for _ in range(16)]
    for env in envs:
        env.reset()
    time.sleep(max(0.0, start_at - time.time()))
    steps, deadline = 0, time.time() + seconds
    while time.time() < deadline:
        for env in envs:
            env.step(actions[steps % len(actions)])
        steps += per_split * num_splits
    counts[index] = steps
    for env in envs:
        env.close()


def raw_limit(env_id: str, num_processes: int, num_envs: int, seconds: float, env_kwargs: dict | None = None
              ) -> float:
    """Env frames per second of `num_processes` plain processes stepping `num_envs` envs each."""
    env_kwargs = env_kwargs or {}
    steps = plain_process_steps(_step_envs, (env_id, env_kwargs, num_envs, seconds), num_processes,
                                start_delay=1.0 + 0.05 * num_processes)
    return steps * env_info(env_id, env_kwargs).frames_per_step / seconds


def vector_raw_limit(env_id: str, num_processes: int, num_envs: int, num_splits: int, seconds: float,
                     env_kwargs: dict | None = None) -> float:
    """Env frames per second of `num_processes` plain processes stepping the vectorised envs of one worker each."""
    env_kwargs = env_kwargs or {}
    steps = plain_process_steps(_step_vector_envs, (env_id, env_kwargs, num_envs, num_splits, seconds), num_processes,
                                start_delay=2.0 + 0.1 * num_processes)
    return steps * env_info(env_id, env_kwargs).frames_per_step / seconds


def machine_raw_limit(env_id: str, env_kwargs: dict, num_envs: int, num_splits: int, batched: bool, seconds: float
                      ) -> dict[str, Any]:
    """The raw limit of this machine for a run's env (benchmark mode): one plain process per core this process may
    use, each stepping a worker's envs (`num_envs`, vectorised in `num_splits` when the run steps them `batched`),
    for `seconds`."""
    processes = len(os.sched_getaffinity(0))
    if batched:
        frames = vector_raw_limit(env_id, processes, num_envs, num_splits, seconds, env_kwargs)
    else:
        frames = raw_limit(env_id, processes, num_envs, seconds, env_kwargs)
    return {"env_frames_per_s": frames, "processes": processes, "envs_per_process": num_envs, "batched": batched,
            "seconds": seconds}


def plain_process_steps(target: Callable, args: tuple, num_processes: int, start_delay: float) -> int:
    """Env steps of `num_processes` forked processes running `target(*args, start_at, counts, index)`, which builds
    its envs, steps them from `start_at` (`start_delay` from now: all have built their envs by then) and writes its
    step count into `counts[index]`."""
    context = multiprocessing.get_context("fork")
    counts = context.Array("q", num_processes)
    start_at = time.time() + start_delay
    processes = [context.Process(target=target, args=(*args, start_at, counts, i)) for i in range(num_processes)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"raw-limit process exited with code {process.exitcode}")
    return sum(counts)


def env_steps_for(env_id: str, frames_per_s: float, seconds: float, env_kwargs: dict | None = None) -> int:
    """The env steps that take `seconds` at `frames_per_s` (an Atari step is 4 frames)."""
    return int(frames_per_s * seconds / env_info(env_id, env_kwargs or {}).frames_per_step)


def sampler_only_fps(env_id: str, num_workers: int, num_envs: int, env_steps: int, extra_args: list[str] | None = None,
                     env_kwargs: dict | None = None) -> dict:
    """Run the trainer with --sampler_only --benchmark and return its benchmark.json summary."""
    with tempfile.TemporaryDirectory() as train_dir:
        run = run_trainer([f"--env={env_id}", f"--env_kwargs={json.dumps(env_kwargs or {})}",
                           f"--train_dir={train_dir}", "--experiment=bench", "--sampler_only=True", "--benchmark=True",
                           f"--benchmark_env_steps={env_steps}", f"--num_workers={num_workers}",
                           f"--num_envs_per_worker={num_envs}", *(extra_args or [])])
        if run.returncode != 0:
            raise RuntimeError(f"trainer failed ({run.returncode}):\n{run.output[-6000:]}")
        with open(os.path.join(train_dir, "bench", "benchmark.json")) as f:
            return json.load(f)
