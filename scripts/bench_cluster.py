"""The Ray backend against the single-machine one, on this machine.

Each round measures both backends with the same flags: --backend=local, and --backend=ray on a fresh Ray cluster
of this machine (ray.cluster_utils.Cluster: a head without CPUs and --nodes nodes; its start is not timed).
--measure=control: sampler-only frames/s on the sleep env with the same total number of actor workers.
--measure=cartpole: seconds from launch to a mean CartPole reward of 475 at the default flags.
The rounds alternate the backends; the script prints every run, the medians and their ratio, and can write them as
JSON.

    python scripts/bench_cluster.py --measure sampler --rounds 3 --out docs/cluster_sampler.json
    python scripts/bench_cluster.py --measure cartpole --rounds 3 --out docs/cluster_cartpole.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from appo.tools.raw_limit import sampler_only_fps
from appo.tools.trainer_process import run_trainer


def measure(args: argparse.Namespace, backend_args: list[str], index: int) -> dict:
    """One run of the chosen measurement with these backend flags."""
    if args.measure == "sampler":
        summary = sampler_only_fps("sleep_env", args.workers, args.num_envs_per_worker, args.env_steps,
                                   [*backend_args, *args.trainer_args], {"step_seconds": args.step_seconds})
        return {"value": summary["env_frames_per_s"], "bottleneck": summary["bottleneck"],
                "cluster": summary.get("cluster")}
    with tempfile.TemporaryDirectory() as train_dir:
        run = run_trainer([f"--train_dir={train_dir}", f"--experiment=solve_{index}", "--target_reward=475",
                           "--train_for_seconds=120", "--env=CartPole-v1", *backend_args, *args.trainer_args])
    return {"value": float("inf") if run.solved_s is None else run.solved_s, "env_steps": run.solved_env_steps}


def ray_run(args: argparse.Namespace, index: int) -> dict:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.node_cpus)
        cluster.wait_for_nodes()
        return measure(args, ["--backend=ray", f"--ray_address={cluster.address}"], index)
    finally:
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", choices=["sampler", "cartpole"], default="sampler")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=16, help="control: actor workers in total (both backends).")
    parser.add_argument("--num_envs_per_worker", type=int, default=8, help="control: envs per actor worker.")
    parser.add_argument("--step_seconds", type=float, default=0.001, help="control: the sleep env's step.")
    parser.add_argument("--env_steps", type=int, default=600_000, help="control: measured env steps of each run.")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--node_cpus", type=int, default=os.cpu_count(),
                        help="Logical CPUs of each Ray node (they share this machine's cores).")
    parser.add_argument("--out", default=None, help="Write the runs and medians as JSON here.")
    parser.add_argument("trainer_args", nargs="*", help="Extra flags for appo.train (after --).")
    args = parser.parse_args()
    unit = "frames/s" if args.measure == "sampler" else "s to 475"
    if args.measure == "sampler":
        print(f"sleep env ({args.step_seconds * 1000:g} ms/step), {args.workers} actor workers x "
              f"{args.num_envs_per_worker} envs, sampler only", end="")
    else:
        print("CartPole-v1 to a mean reward of 475, default flags", end="")
    print(f"; ray: {args.nodes} nodes of {args.node_cpus} CPUs on this machine")
    runs: dict[str, list[dict]] = {"local": [], "ray": []}
    for index in range(args.rounds):
        for backend in ("local", "ray"):
            run = measure(args, [], index) if backend == "local" else ray_run(args, index)
            runs[backend].append(run)
            print(f"round {index + 1} {backend:5s} {run['value']:10,.1f} {unit}  "
                  f"{run.get('bottleneck') or run.get('env_steps')}", flush=True)
    medians = {backend: statistics.median(run["value"] for run in rows) for backend, rows in runs.items()}
    ratio = medians["ray"] / medians["local"]
    print(f"median: local {medians['local']:,.1f} {unit}, ray {medians['ray']:,.1f} {unit}, ray/local {ratio:.1%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"measure": args.measure, "flags": vars(args), "runs": runs, "medians": medians,
                       "ray_over_local": ratio}, f, indent=2)


if __name__ == "__main__":
    main()
