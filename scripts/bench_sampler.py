"""Sampler throughput against the raw limit of the env on this machine.

First N plain processes step the env with random actions (the raw limit), then the trainer runs with
--sampler_only (actors + inference, no learning) with the same workers and envs; prints both and the ratio.
With --batched the trainer runs with --batched_sampling, and the raw limit steps the same vectorised envs
(envs/vector.py: --worker_num_splits of them per process, --num_envs_per_worker sub-envs in all) in plain processes,
so the ratio compares like with like.

    python scripts/bench_sampler.py --env=atari_breakout --num_workers=2 --num_envs_per_worker=8
    python scripts/bench_sampler.py --env=CartPole-v1 --batched --num_envs_per_worker=1024 --seconds=5
"""

from __future__ import annotations

import argparse
import json
import time

from appo.envs import env_info
from appo.tools.raw_limit import env_steps_for, plain_process_steps, raw_limit, sampler_only_fps


def _step_vector_envs(env_id: str, env_kwargs: dict, num_envs: int, num_splits: int, seconds: float, start_at: float,
                      counts, index: int) -> None:
    """One plain process: `num_splits` vectorised envs of `num_envs / num_splits` sub-envs, stepped in turn with
    random actions (drawn up front: the sampler's actions come from inference, not from the actor)."""
    from gymnasium.vector.utils import batch_space
    from threadpoolctl import threadpool_limits

    from appo.envs.vector import make_vector_env
    from appo.sampling.vector_stepper import to_env_actions

    threadpool_limits(1)
    per_split = num_envs // num_splits
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
        steps += num_envs
    counts[index] = steps
    for env in envs:
        env.close()


def vector_raw_limit(env_id: str, num_processes: int, num_envs: int, num_splits: int, seconds: float,
                     env_kwargs: dict) -> float:
    """Env frames per second of `num_processes` plain processes stepping the vectorised envs of one worker each."""
    steps = plain_process_steps(_step_vector_envs, (env_id, env_kwargs, num_envs, num_splits, seconds), num_processes,
                                start_delay=2.0 + 0.1 * num_processes)
    return steps * env_info(env_id, env_kwargs).frames_per_step / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env_kwargs", default="{}", help="JSON object passed to the env's make function.")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--num_envs_per_worker", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="Length of the raw-limit measurement.")
    parser.add_argument("--env_steps", type=int, default=0,
                        help="Trainer budget; 0 means as many steps as the raw limit made in --seconds.")
    parser.add_argument("--repeats", type=int, default=1, help="Measure both this many times; report medians.")
    parser.add_argument("--batched", action="store_true",
                        help="Batched sampling: --batched_sampling=True, and the raw limit of the vectorised envs.")
    parser.add_argument("--worker_num_splits", type=int, default=2)
    parser.add_argument("trainer_args", nargs="*", help="Extra flags for appo.train (after --).")
    args = parser.parse_args()
    kwargs = json.loads(args.env_kwargs)

    trainer_args = [f"--worker_num_splits={args.worker_num_splits}", *args.trainer_args]
    if args.batched:
        trainer_args.append("--batched_sampling=True")
    raws, trainers = [], []
    for _ in range(args.repeats):
        if args.batched:
            raw = vector_raw_limit(args.env, args.num_workers, args.num_envs_per_worker, args.worker_num_splits,
                                   args.seconds, kwargs)
        else:
            raw = raw_limit(args.env, args.num_workers, args.num_envs_per_worker, args.seconds, kwargs)
        budget = args.env_steps or max(1000, env_steps_for(args.env, raw, args.seconds, kwargs))
        summary = sampler_only_fps(args.env, args.num_workers, args.num_envs_per_worker, budget, trainer_args, kwargs)
        raws.append(raw)
        trainers.append(summary["env_frames_per_s"])
        print(f"raw limit {raw:10.0f} frames/s | sampler-only trainer {summary['env_frames_per_s']:10.0f} frames/s"
              f" | ratio {summary['env_frames_per_s'] / raw:.1%} | bottleneck: {summary['bottleneck']}", flush=True)
    raw, trainer = sorted(raws)[len(raws) // 2], sorted(trainers)[len(trainers) // 2]
    print(f"{args.env}{' batched' * args.batched}, {args.num_workers} workers x {args.num_envs_per_worker} envs "
          f"({args.worker_num_splits} splits): raw limit {raw:.0f} frames/s, "
          f"sampler-only {trainer:.0f} frames/s, ratio {trainer / raw:.1%} (median of {args.repeats})")


if __name__ == "__main__":
    main()
