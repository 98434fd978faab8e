"""The raw limit of an env, and a sampler-only trainer run to hold against it (scripts/bench_sampler.py,
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

from appo.envs import env_info, make_env
from appo.tools.trainer_process import run_trainer


def _step_envs(env_id: str, env_kwargs: dict, num_envs: int, seconds: float, start_at: float, counts, index: int
               ) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    envs = [make_env(env_id, env_kwargs) for _ in range(num_envs)]
    num_agents = int(getattr(envs[0], "num_agents", 1))
    for env in envs:
        env.reset()
        env.action_space.seed(index)
    time.sleep(max(0.0, start_at - time.time()))
    steps, deadline = 0, time.time() + seconds
    while time.time() < deadline:
        for env in envs:
            action = env.action_space.sample()
            if num_agents > 1:
                action = [env.action_space.sample() for _ in range(num_agents)]
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        steps += num_envs * num_agents
    counts[index] = steps


def raw_limit(env_id: str, num_processes: int, num_envs: int, seconds: float, env_kwargs: dict | None = None
              ) -> float:
    """Env frames per second of `num_processes` plain processes stepping `num_envs` envs each."""
    env_kwargs = env_kwargs or {}
    steps = plain_process_steps(_step_envs, (env_id, env_kwargs, num_envs, seconds), num_processes,
                                start_delay=1.0 + 0.05 * num_processes)
    return steps * env_info(env_id, env_kwargs).frames_per_step / seconds


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
