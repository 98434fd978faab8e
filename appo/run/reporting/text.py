"""The status the runner prints every --report_interval and the summary it prints at the end."""

from __future__ import annotations

from appo.config.views import RunnerConfig
from appo.run.reporting.formatting import duration, fit, si
from appo.run.reporting.numbers import Numbers
from appo.run.reporting.tally import RATE_WINDOWS, Tally


class StatusText:
    """The printed text. The status: one line each for progress (percent of the budget, elapsed time, ETA, env steps,
    FPS over each rate window), every policy, the faults survived (when any), the cluster (--backend=ray), the PBT
    population and the ratings; the summary: time, env steps, each policy's final and best reward and newest
    checkpoint. Every line at most LINE_WIDTH characters (a long one goes on, indented, on the next), except a
    checkpoint's path. Reads a Tally and its Numbers; writes nothing."""

    def __init__(self, tally: Tally, numbers: Numbers, cfg: RunnerConfig) -> None:
        self.tally, self.numbers, self.cfg = tally, numbers, cfg

    def status(self) -> str:
        tally = self.tally
        lines = self._progress_lines()
        for p in range(self.cfg.num_policies):
            lines += self._policy_lines(p)
        lines += self._fault_lines()
        if tally.cluster.report is not None:
            lines += self._cluster_lines()
        if tally.hyperparams is not None:
            lines += fit(self._population_pieces(), indent="  ")
        if tally.ratings is not None:
            for parts in tally.ratings.status_pieces(self.cfg.num_policies):  # a line (or two) per policy
                lines += fit([f"ratings: {parts[0]}", *parts[1:]], indent="  ")
        return "\n".join(lines)

    def _progress_lines(self) -> list[str]:
        elapsed = duration(self.numbers.elapsed())
        progress = self.numbers.progress()
        if progress is None:
            head = f"no budget, {elapsed} elapsed, ETA -"
        else:
            fraction, budget, eta = progress
            head = f"{fraction:.1%} of {budget} in {elapsed}, ETA {'-' if eta is None else duration(eta)}"
        fps = "/".join(si(self.numbers.fps(w)) for w in RATE_WINDOWS)
        windows = "/".join(f"{w}s" for w in RATE_WINDOWS)
        memory = [f" | memory {self._memory(self.tally.memory_mb)}"] if self.tally.memory_mb else []
        return fit([head, f" | env steps {self.tally.total_env_steps()}", f" | FPS {windows} {fps}", *memory])

    def _memory(self, used_mb: float) -> str:
        """The run's memory against the machine's (or its cgroup's) limit: '3.1 of 24.0 GB'."""
        return f"{used_mb / 1024:.1f} of {self.tally.memory_limit_mb / 1024:.1f} GB"

    def _policy_lines(self, p: int) -> list[str]:
        policy, numbers = self.tally.policies[p], self.numbers
        episode = numbers.mean_episode(p)
        pieces = [f"p{p}: v{policy.version}"]
        if episode is not None:
            pieces[0] += f", reward {episode[0]:.2f} length {episode[1]:.1f}"
            pieces.append(f" ({len(policy.episodes.recent)} of {policy.episodes.total} episodes)")
        else:
            pieces.append(", no finished episode yet")
        objective = numbers.mean_objective(p)
        if self.cfg.show_objective and objective is not None:
            pieces.append(f", objective {objective:.3f}")
        pieces.append(f", {si(numbers.sample_throughput(p))} samples/s")
        stats = policy.stats
        if "epochs" in stats:
            pieces.append(f", epochs {stats['epochs']:.1f}")
        if self.cfg.lr_schedule != "constant" and "learning_rate" in stats:
            pieces.append(f", lr {stats['learning_rate']:.2g}")
        if "lag_avg" in stats:
            pieces.append(f", lag {stats['lag_min']:.0f}/{stats['lag_avg']:.1f}/{stats['lag_max']:.0f}")
        evaluation = policy.evaluation
        if evaluation is not None:
            results = evaluation.results
            pieces.append(f", eval {results['reward']:.2f} ± {results['reward_std']:.2f} "
                          f"at {si(evaluation.env_steps)} steps")
        return fit(pieces, indent="  ")

    def _fault_lines(self) -> list[str]:
        tally, faults = self.tally, []
        if tally.env_errors:
            faults.append(f"env errors {tally.env_errors} (episodes lost, envs rebuilt)")
        if tally.illegal_actions:
            faults.append(f"illegal actions {tally.illegal_actions} (not allowed by their action masks)")
        if tally.nonfinite_values:
            faults.append(f"non-finite values {tally.nonfinite_values} (set to 0)")
        skipped = sum(policy.skipped_updates for policy in tally.policies)
        if skipped:
            faults.append(f"updates skipped (non-finite) {skipped}")
        restarts = ", ".join(f"{role} {n}" for role, n in sorted(tally.restart_counts().items()) if n)
        if restarts:
            faults.append(f"restarts: {restarts}")
        if not faults:
            return []
        return fit([f"faults: {faults[0]}"] + [f", {fault}" for fault in faults[1:]], indent="  ")

    def _cluster_lines(self) -> list[str]:
        """Per sampler group: its node and FPS (or why it is not running); then the head's bytes/s in and out."""
        cluster, groups = self.tally.cluster, []
        for group in cluster.groups():
            if group["running"]:
                state = f"{si(cluster.group_fps(group))} FPS"
            else:
                state = f"lost ({group['lost'][:60]}), waiting for CPUs" if group["lost"] else "starting"
            groups.append(f"{group['name']} {group['node'] or '-'} {state}")
        trajectories, weights, busy = cluster.latest.per_second()
        text = (f"cluster: {'; '.join(groups)}; trajectories in {si(trajectories)}B/s, weights out {si(weights)}B/s, "
                f"head busy {busy:.0%}")
        pieces = text.split(";")
        return fit([f"{piece};" for piece in pieces[:-1]] + pieces[-1:], indent="  ")

    def _population_pieces(self) -> list[str]:
        """The population's best and worst objective, over whatever episodes each policy has so far (pieces for
        `fit`). Episodes that never report --pbt_target_objective (a name the env's info does not hold) say so."""
        if self.cfg.elo_objective:
            return ["PBT objective: Elo (ratings below)"]
        means = {p: self.numbers.mean_objective(p) for p in range(self.cfg.num_policies)}
        means = {p: mean for p, mean in means.items() if mean is not None}
        if not means:
            episodes = [self.tally.policies[p].episodes.total for p in range(self.cfg.num_policies)]
            if min(episodes) < self.cfg.stats_avg:
                return ["PBT objective: no episodes yet"]
            return [f"PBT objective: none of {sum(episodes)} episodes reported --pbt_target_objective="
                    f"{self.cfg.pbt_target_objective}", " (their last step's info, its episode_extra_stats)",
                    ": PBT cannot rank the policies"]
        best, worst = max(means, key=means.get), min(means, key=means.get)
        return [f"PBT objective best {means[best]:.3f} (p{best}) worst {means[worst]:.3f} (p{worst})"]

    def summary(self, checkpoints: list[str | None]) -> str:
        """The run at its end: time, env steps, and per policy the final mean reward (last --stats_avg episodes),
        the best full-window mean reward of this session and the newest checkpoint; one line each."""
        seconds = self.numbers.elapsed()
        took = f"{seconds:.1f} s" + (f" ({duration(seconds)})" if seconds >= 60 else "")
        lines = [f"Summary: {took}, {self.tally.total_env_steps()} env steps"]
        stats = self.numbers.final_stats()
        for p in range(self.cfg.num_policies):
            if p in stats:
                best = self.numbers.best_rewards[p]
                lines += fit([f"p{p}: final reward {stats[p]['reward']:.2f}",
                              f" (best {'-' if best is None else f'{best:.2f}'})",
                              f" over {stats[p]['episodes']} episodes"], indent="  ")
            else:
                lines.append(f"  p{p}: no finished episode")
            # The one line that may pass LINE_WIDTH: only by the length of the checkpoint's path, left whole.
            lines.append(f"  p{p} checkpoint: {checkpoints[p] or 'none'}")
        if self.tally.peak_memory_mb:
            lines.append(f"  memory: peak {self._memory(self.tally.peak_memory_mb)}")
        return "\n".join(lines)
