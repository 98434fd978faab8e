"""Derived numbers: what the status, the summaries, the stop rules and PBT compute from a Tally."""

from __future__ import annotations

import numpy as np

from appo.config.cfg import NO_BUDGET
from appo.config.views import RunnerConfig
from appo.run.reporting.formatting import duration, si
from appo.run.reporting.tally import Tally

# --train_for_env_steps and --train_for_seconds default to 1e10: that means no budget, not a 300-year ETA.
# An ETA beyond this is shown as unknown ("ETA -").
MAX_ETA_S = 100 * 86400


class Numbers:
    """Numbers computed on demand from a Tally: frames and samples per second, progress toward the budget and its
    ETA, episode means over the --stats_avg window, PBT's objective, a policy that reached a target, the measured
    period's counts. Owns only each policy's best full-window mean reward so far (and the episode count it was last
    checked at), which `track_best_rewards` updates. Writes nothing."""

    def __init__(self, tally: Tally, cfg: RunnerConfig, frames_per_step: int) -> None:
        self.tally, self.cfg, self.frames_per_step = tally, cfg, frames_per_step
        self.best_rewards: list[float | None] = [None] * cfg.num_policies
        self._best_checked_at = [0] * cfg.num_policies

    # ---------------------------------------------------------------- rates and progress
    def elapsed(self) -> float:
        """Seconds since this session's reporting began."""
        return self.tally.clock() - self.tally.start

    def fps(self, window: float) -> float:
        """Env frames per second (env steps times the env's frame skip) over the last `window` seconds."""
        return self.tally.sampled_history.rate(window) * self.frames_per_step

    def sample_throughput(self, policy: int, window: float = 10.0) -> float:
        """Trained samples per second of one policy."""
        return self.tally.policies[policy].sample_history.rate(window)

    def env_step_rate(self, window: float = 60.0) -> float:
        """Env steps per second (the count the budget is in: all policies' learners) over the last window."""
        return self.tally.env_step_history.rate(window)

    def measured(self) -> tuple[float, int, int]:
        """Seconds, env steps and trained samples of the measured period (every actor sampling)."""
        return self.tally.period.counts(self.tally.sampled_env_steps, self.tally.samples())

    def progress(self) -> tuple[float, str, float | None] | None:
        """How far the run is toward the budget closest to done: (fraction done, that budget in words, seconds left
        or None when unknown); None when no budget is set."""
        budgets = self._budgets()
        if not budgets:
            return None
        fraction, budget, eta = max(budgets, key=lambda b: b[0])
        return min(fraction, 1.0), budget, eta if eta is not None and eta <= MAX_ETA_S else None

    def _budgets(self) -> list[tuple[float, str, float | None]]:
        """Every budget set: (fraction done, the budget in words, seconds left or None). Step budgets estimate the
        time left from the rate of the last minute; --train_for_seconds counts this session, as the runner does;
        a benchmark counts from the moment every actor samples, as the runner does."""
        cfg, budgets = self.cfg, []

        def steps_budget(done: float, budget: float, rate: float, what: str) -> None:
            eta = max(budget - done, 0) / rate if rate > 0 else None
            budgets.append((done / budget, f"{si(budget, trim=True)} {what}", eta))

        if cfg.train_for_env_steps < NO_BUDGET:
            steps_budget(self.tally.total_env_steps(), cfg.train_for_env_steps, self.env_step_rate(), "steps")
        if cfg.train_for_seconds < NO_BUDGET:
            elapsed = self.elapsed()
            budgets.append((elapsed / cfg.train_for_seconds, duration(cfg.train_for_seconds),
                            max(cfg.train_for_seconds - elapsed, 0.0)))
        if cfg.benchmark:
            _, env_steps, samples = self.measured()
            steps_budget(env_steps, cfg.benchmark_env_steps, self.tally.sampled_history.rate(60),
                         "benchmark steps")
            if not cfg.sampler_only:
                rate = sum(self.sample_throughput(p, 60) for p in range(cfg.num_policies))
                steps_budget(samples, cfg.benchmark_samples, rate, "benchmark samples")
        return budgets

    # ---------------------------------------------------------------- episodes
    def mean_episode(self, policy: int) -> tuple[float, float] | None:
        """Mean reward and length over the policy's last --stats_avg episodes; None before the first."""
        episodes = self.tally.policies[policy].episodes.recent
        if not episodes:
            return None
        rewards, lengths = zip(*episodes)
        return float(np.mean(rewards)), float(np.mean(lengths))

    def mean_objective(self, policy: int) -> float | None:
        """Mean objective over whatever episodes (up to --stats_avg) the policy has reported one for."""
        objectives = self.tally.policies[policy].episodes.objectives
        return float(np.mean(objectives)) if objectives else None

    def extra_means(self, policy: int) -> dict[str, float]:
        """Each metric of info["episode_extra_stats"]: its mean over the policy's last --stats_avg values."""
        return {name: float(np.mean(values)) for name, values in self.tally.policies[policy].episodes.extra.items()}

    def _full_window(self, policy: int, measure: str) -> list[float] | None:
        """Episode "reward" or "objective" of the last --stats_avg episodes; None until there are that many, and
        until every env has ended an episode (Tally.every_env_ended): before, the window holds the short episodes
        of the synchronised start, so the targets, the best reward and PBT would judge a policy on luck."""
        if not self.tally.every_env_ended:
            return None
        window = self.tally.policies[policy].episodes
        values = list(window.objectives) if measure == "objective" else [reward for reward, _ in window.recent]
        return values if len(values) == self.cfg.stats_avg else None

    def full_window_mean(self, policy: int, measure: str) -> float | None:
        """Mean episode "reward" or "objective" over the last --stats_avg episodes; None until `_full_window` has
        them. The one rule of the targets, the best reward, PBT and a sweep's scores and pruning."""
        values = self._full_window(policy, measure)
        return None if values is None else float(np.mean(values))

    def final_rewards(self) -> list[float | None]:
        """Each policy's full-window mean reward now (None without a full window): a sweep's final_reward score, judged
        by the rule of the targets rather than by the short episodes of a run that ended early."""
        return [self.full_window_mean(policy, "reward") for policy in range(self.cfg.num_policies)]

    def objective(self, policy: int) -> float | None:
        """What PBT ranks the policy by."""
        return self.full_window_mean(policy, "objective")

    def objective_error(self, policy: int) -> float | None:
        """Standard error of `objective` (std / sqrt(n) over the same window), so PBT replaces a policy only on a
        lead larger than the episodes' noise; None without a full window, or with a window of one episode."""
        values = self._full_window(policy, "objective")
        if values is None or len(values) < 2:
            return None
        return float(np.std(values, ddof=1) / np.sqrt(len(values)))

    def solved_policy(self, target: float, measure: str = "reward") -> tuple[int, float] | None:
        """A policy whose full-window mean reward (or objective) reaches target, with that mean."""
        for policy in range(self.cfg.num_policies):
            mean = self.full_window_mean(policy, measure)
            if mean is not None and mean >= target:
                return policy, mean
        return None

    def track_best_rewards(self) -> None:
        """Each policy's best mean reward over a full --stats_avg window so far; recomputed only when episodes came
        in since the last check."""
        for p, policy in enumerate(self.tally.policies):
            if policy.episodes.total == self._best_checked_at[p]:
                continue
            self._best_checked_at[p] = policy.episodes.total
            mean = self.full_window_mean(p, "reward")
            if mean is not None and (self.best_rewards[p] is None or mean > self.best_rewards[p]):
                self.best_rewards[p] = mean

    def final_stats(self) -> dict[int, dict[str, float]]:
        """Per policy with finished episodes: the mean reward and length over the last --stats_avg episodes, the
        number of episodes that mean is over and, when the env reports one, the mean objective."""
        stats = {}
        for policy in range(self.cfg.num_policies):
            episode = self.mean_episode(policy)
            if episode is None:
                continue
            stats[policy] = {"reward": episode[0], "length": episode[1],
                             "episodes": len(self.tally.policies[policy].episodes.recent)}
            objective = self.mean_objective(policy)
            if objective is not None:
                stats[policy]["objective"] = objective
            for name, value in self.extra_means(policy).items():  # the trainer's own names win
                stats[policy].setdefault(name, value)
        return stats
