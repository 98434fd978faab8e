"""The benchmark's summary (saved as benchmark.json), its printed table, and the diagnosis of what limits throughput."""

from __future__ import annotations

import os
from typing import Any

import psutil

from appo.config.checks import env_kwargs
from appo.config.views import RunnerConfig
from appo.envs.vector import steps_batched
from appo.run.reporting.formatting import si
from appo.run.reporting.numbers import Numbers
from appo.run.reporting.tally import Tally
from appo.utils.logs import log

# What each component's timing keys mean, in the order the benchmark table shows them.
TIME_SHARES = {
    "actor": {"env_step": "env step", "wait_actions": "waiting for actions", "wait_buffers": "waiting for buffers"},
    "inference": {"forward": "forward", "weights": "weight updates", "wait": "waiting"},
    "learner": {"batching": "batching", "sgd": "SGD", "wait": "waiting"},
}


def measure_raw_limit(cfg: RunnerConfig) -> dict[str, Any]:
    """The machine's raw limit for the run's env (appo/tools/raw_limit.py `machine_raw_limit`): what its cores give
    when they only step the env, the ceiling the trainer's frames/s is a fraction of on any machine."""
    from appo.tools.raw_limit import machine_raw_limit

    log.info("Benchmark: the raw limit first, %g s of plain processes stepping %s with random actions",
             cfg.benchmark_raw_limit_s, cfg.env)
    return machine_raw_limit(cfg.env, env_kwargs(cfg), cfg.num_envs_per_worker, cfg.worker_num_splits,
                             steps_batched(cfg.env, cfg.batched_sampling), cfg.benchmark_raw_limit_s)


def benchmark_summary(tally: Tally, numbers: Numbers, cfg: RunnerConfig, env_name: str,
                      raw_limit: dict[str, Any] | None = None) -> dict[str, Any]:
    """Throughput, and where each component's time went, since every actor worker is sampling; with the machine's
    raw limit (`measure_raw_limit`) when it was measured."""
    period = tally.period
    seconds, env_steps, samples = numbers.measured()
    measured = max(seconds, 1e-9)
    lag = period.lag
    summary = {
        "env": env_name, "num_workers": cfg.num_workers, "num_envs_per_worker": cfg.num_envs_per_worker,
        "worker_num_splits": cfg.worker_num_splits, "num_policies": cfg.num_policies,
        "sampler_only": cfg.sampler_only, "device": tally.device, "cpu_count": os.cpu_count(),
        "actor_niceness": cfg.actor_niceness, "actor_sched_batch": cfg.actor_sched_batch,
        "processes": cfg.num_workers + cfg.inference_processes + cfg.num_policies + 1,  # + runner
        "wall_seconds": numbers.elapsed(), "measured_seconds": measured,
        "env_steps": env_steps, "env_frames": env_steps * numbers.frames_per_step,
        "env_steps_per_s": env_steps / measured,
        "env_frames_per_s": env_steps * numbers.frames_per_step / measured,
        "samples_per_s": samples / measured,
        "policy_lag": {"min": lag["min"] if lag["reports"] else 0.0, "max": lag["max"],
                       "avg": lag["avg_sum"] / lag["reports"] if lag["reports"] else 0.0},
        "time_shares": time_shares(period.timing),
        "inference_batch_size": period.inference_obs / max(period.inference_batches, 1),
        "cpu_busy": cpu_busy(period.cpu_at_start, psutil.cpu_times()),
    }
    cluster = tally.cluster
    if cluster.report is not None:  # --backend=ray: what the head's cluster process moved
        trajectories, weights, busy = cluster.measured.per_second()
        summary["cluster"] = {"groups": len(cluster.groups()), "trajectory_bytes_per_s": trajectories,
                              "weights_bytes_per_s": weights, "head_busy": busy}
    if raw_limit is not None:
        summary["raw_limit"] = raw_limit
        summary["fraction_of_raw_limit"] = summary["env_frames_per_s"] / max(raw_limit["env_frames_per_s"], 1e-9)
    summary["bottleneck"] = diagnose(summary)
    return summary


def time_shares(timing: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per component, the fraction of its processes' summed "elapsed" seconds spent on each activity of TIME_SHARES,
    and the rest as "other"."""
    shares = {}
    for component, keys in TIME_SHARES.items():
        total = max(timing[component].get("elapsed", 0.0), 1e-9)
        shares[component] = {key: timing[component].get(key, 0.0) / total for key in keys}
        shares[component]["other"] = max(0.0, 1.0 - sum(shares[component].values()))
    return shares


def cpu_busy(before: Any, after: Any) -> float:
    """Fraction of all cores' time spent busy between two psutil.cpu_times() readings."""
    total = sum(after) - sum(before)
    idle = (after.idle - before.idle) + (getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0))
    return 1.0 - idle / total if total > 0 else 0.0


def diagnose(summary: dict[str, Any]) -> str:
    """One line naming the component that limits throughput and the flag that would move it."""
    actor, inference, learner = (summary["time_shares"][c] for c in ("actor", "inference", "learner"))
    processes = summary["processes"]
    cpu = summary["cpu_busy"]
    saturated = cpu > 0.9
    busy = {"actors": actor["env_step"], "inference": inference["forward"],
            "learner": 0.0 if summary["sampler_only"] else learner["sgd"] + learner["batching"]}
    on_gpu = str(summary.get("device", "cpu")).startswith("cuda")
    learner_remedy = "lower --ppo_epochs or --num_batches_per_iteration, " + (
        "or raise --batch_size (fewer, larger steps on the GPU)" if on_gpu
        else "raise --learner_torch_threads if cores are free, or use --device=cuda")
    to_gpu = "" if on_gpu else " or --device=cuda"
    cluster = summary.get("cluster")
    if cluster is not None and cluster["head_busy"] > 0.8:
        return (f"network: the head's cluster process is busy {cluster['head_busy']:.0%} of its time taking in "
                f"{si(cluster['trajectory_bytes_per_s'])}B/s of trajectories and sending "
                f"{si(cluster['weights_bytes_per_s'])}B/s of weights; a longer --rollout (fewer, larger transfers) "
                "or a faster link between the nodes")
    if actor["wait_buffers"] > 0.25 and not summary["sampler_only"]:
        return (f"learner: actors wait {actor['wait_buffers']:.0%} of their time for trajectory slots while the "
                f"learner is busy {busy['learner']:.0%}; {learner_remedy}")
    if busy["inference"] >= max(busy.values()) and busy["inference"] > 0.6:
        remedy = "add --policy_workers_per_policy" + to_gpu
        if saturated:
            remedy = (f"fewer, larger requests (--num_envs_per_worker){to_gpu}; more inference workers cannot help "
                      "on saturated cores")
            if summary["actor_niceness"] == 0 and actor["wait_actions"] > 0.2:
                remedy = "--actor_niceness=10 so inference preempts the actors on saturated cores, or " + remedy
        return (f"inference: busy {busy['inference']:.0%} while actors wait {actor['wait_actions']:.0%} for actions; "
                f"{remedy}")
    if busy["learner"] >= max(busy.values()) and busy["learner"] > 0.6:
        return f"learner: busy {busy['learner']:.0%} of its time; {learner_remedy}"
    if actor["wait_actions"] > actor["env_step"]:
        if saturated and summary["actor_niceness"] == 0:
            return (f"CPU: {processes} processes keep {summary['cpu_count']} cores {cpu:.0%} busy and actors wait "
                    f"{actor['wait_actions']:.0%} for actions; --actor_niceness=10 lets inference run first")
        if saturated:
            return (f"CPU: {processes} processes keep {summary['cpu_count']} cores {cpu:.0%} busy, actors wait "
                    f"{actor['wait_actions']:.0%} for actions; raise --num_envs_per_worker (bigger batches, fewer "
                    "messages) rather than --num_workers")
        return (f"round trips: actors wait {actor['wait_actions']:.0%} for actions while inference is busy only "
                f"{inference['forward']:.0%}; raise --num_envs_per_worker or --worker_num_splits")
    more = "raise --num_workers" if not saturated else f"a faster env or more cores (cores {cpu:.0%} busy)"
    return f"env stepping: actors spend {actor['env_step']:.0%} of their time in env.step; {more}"


def format_benchmark(summary: dict[str, Any]) -> str:
    """The summary as the table the runner prints at the end of a benchmark."""
    lag = summary["policy_lag"]
    lines = [
        f"Benchmark: {summary['env']}, {summary['num_workers']} workers x {summary['num_envs_per_worker']} envs"
        f"{', sampler only' if summary['sampler_only'] else ''}, {summary['cpu_count']} CPUs, "
        f"device {summary['device']}",
        f"  env frames/s   {summary['env_frames_per_s']:12,.0f}   ({summary['env_steps']:,} env steps in "
        f"{summary['measured_seconds']:.1f} s once all actors sample; {summary['wall_seconds']:.1f} s wall)",
        *raw_limit_lines(summary),
        f"  samples/s      {summary['samples_per_s']:12,.0f}   (trained)",
        f"  policy lag     {lag['min']:.0f} / {lag['avg']:.1f} / {lag['max']:.0f} (min / avg / max versions)",
        f"  CPU busy       {summary['cpu_busy']:12.0%}   (all {summary['cpu_count']} cores, measured period)",
    ]
    for component, keys in TIME_SHARES.items():
        shares = summary["time_shares"][component]
        cells = [f"{label} {shares[key]:4.0%}" for key, label in keys.items()] + [f"other {shares['other']:4.0%}"]
        if component == "inference":
            cells.append(f"{summary['inference_batch_size']:.1f} obs per batch")
        lines.append(f"  {component:10s} " + " | ".join(cells))
    if "cluster" in summary:
        cluster = summary["cluster"]
        lines.append(f"  cluster        {cluster['groups']} sampler groups, trajectories in "
                     f"{si(cluster['trajectory_bytes_per_s'])}B/s, weights out "
                     f"{si(cluster['weights_bytes_per_s'])}B/s, head busy {cluster['head_busy']:.0%}")
    lines.append(f"  bottleneck: {summary['bottleneck']}")
    return "\n".join(lines)


def raw_limit_lines(summary: dict[str, Any]) -> list[str]:
    """The raw limit's line of the table (none when it was not measured)."""
    raw = summary.get("raw_limit")
    if raw is None:
        return []
    how = f"{raw['processes']} plain processes x {raw['envs_per_process']} envs{', vectorised' * raw['batched']}"
    return [f"  raw limit      {raw['env_frames_per_s']:12,.0f}   ({how}, random actions, nothing else, "
            f"{raw['seconds']:g} s): the trainer ran at {summary['fraction_of_raw_limit']:.0%} of it"]
