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

from appo.config.cfg import ConfigError, parse_args
from appo.envs import EnvError, env_info
from appo.tools.raw_limit import env_steps_for, raw_limit, sampler_only_fps, vector_raw_limit


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
    if not args.seconds > 0 or args.repeats < 1 or args.env_steps < 0:
        parser.error(f"--seconds={args.seconds:g} must be more than 0, --repeats={args.repeats} 1 or more and "
                     f"--env_steps={args.env_steps} 0 or more")
    trainer_args = [f"--worker_num_splits={args.worker_num_splits}", *args.trainer_args]
    if args.batched:
        trainer_args.append("--batched_sampling=True")
    try:  # the trainer's own checks and the env, before the raw limit's processes start
        parse_args([f"--env={args.env}", f"--env_kwargs={args.env_kwargs}", f"--num_workers={args.num_workers}",
                    f"--num_envs_per_worker={args.num_envs_per_worker}", *trainer_args])
        kwargs = json.loads(args.env_kwargs)
        env_info(args.env, kwargs)
    except (ConfigError, EnvError) as exc:
        parser.error(str(exc))
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
