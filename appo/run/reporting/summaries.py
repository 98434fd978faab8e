"""The run's summaries, each policy's scalars at its env steps, handed to the Recorder (appo/tracking/): tensorboard
under <experiment>/summaries/<policy>/, and the trackers that are on; and the learning curve drawn from them."""

from __future__ import annotations

import os

from appo.config.checks import installed
from appo.config.views import RunnerConfig
from appo.messages import Evaluation
from appo.run.reporting.numbers import Numbers
from appo.run.reporting.tally import Tally
from appo.tracking import Recorder
from appo.tracking.writer import one_line
from appo.utils.logs import log


class SummaryWriters:
    """Turns a Tally and its Numbers into summaries: perf/, episode/, episode_extra/, learner/, lag/, memory/, faults/
    and, in their runs, cluster/, pbt/, selfplay/ and eval/, each at the policy's env steps. Each write builds one
    dict of a policy's scalars and hands it to the Recorder (appo/tracking/), which keeps it in tensorboard and in
    the trackers that are on. Reads everything; owns nothing."""

    def __init__(self, tally: Tally, numbers: Numbers, cfg: RunnerConfig, recorder: Recorder) -> None:
        self.tally, self.numbers, self.cfg, self.recorder = tally, numbers, cfg, recorder

    def write(self, memory_mb: dict[str, float]) -> None:
        """Everything, for every policy; run-wide counts go with the first policy."""
        for p in range(self.cfg.num_policies):
            values = self._policy_values(p)
            values.update((f"memory/{name}_mb", mb) for name, mb in memory_mb.items())
            if p == 0:
                values.update(self._run_values())
            if self.tally.hyperparams is not None:
                values.update(self._pbt_values(p))
            if self.tally.ratings is not None:
                values.update(self._rating_values(p))
            self.recorder.scalars(p, self.tally.env_steps[p], values)
            if p == 0 and self.tally.ratings is not None and "p0" in self.tally.ratings.elo:
                self.recorder.text(0, self.tally.env_steps[0], "selfplay/table",
                                   "\n\n".join(self.tally.ratings.table()))

    def _policy_values(self, p: int) -> dict[str, float]:
        policy, numbers = self.tally.policies[p], self.numbers
        values = {"perf/fps_10s": numbers.fps(10), "perf/fps_60s": numbers.fps(60),
                  "perf/samples_per_s": numbers.sample_throughput(p), "perf/policy_version": policy.version,
                  "perf/dropped_trajectories": policy.dropped}
        episode = numbers.mean_episode(p)
        if episode is not None:
            values["episode/reward"], values["episode/length"] = episode
        full_window = numbers.full_window_mean(p, "reward")
        if full_window is not None:  # what a sweep's pruner reads (appo/sweep/trial.py)
            values["episode/full_window_reward"] = full_window
        values.update((f"episode_extra/{name}", value) for name, value in numbers.extra_means(p).items())
        values.update((f"{'lag' if key.startswith('lag') else 'learner'}/{key}", value)
                      for key, value in policy.stats.items())
        values["faults/skipped_updates"] = policy.skipped_updates
        return values

    def _run_values(self) -> dict[str, float]:
        """The run-wide faults and, with --backend=ray, the cluster's rates."""
        tally = self.tally
        restarts = tally.restart_counts()
        values = {"faults/env_errors": tally.env_errors, "faults/nonfinite_values": tally.nonfinite_values,
                  "faults/illegal_actions": tally.illegal_actions,
                  **{f"faults/restarts_{role}": restarts.get(role, 0) for role in ("actor", "inference", "learner")}}
        cluster = tally.cluster
        if cluster.report is None:
            return values
        values.update((f"cluster/{group['name']}_fps", cluster.group_fps(group)) for group in cluster.groups())
        trajectories, weights, busy = cluster.latest.per_second()
        values.update({"cluster/trajectory_bytes_per_s": trajectories, "cluster/weights_bytes_per_s": weights,
                       "cluster/head_busy": busy,
                       "faults/sampler_groups_replaced": restarts.get("sampler group", 0)})
        return values

    def write_evaluation(self, report: Evaluation) -> None:
        """All of an evaluation's results, under eval/, at the env steps it was taken at."""
        self.recorder.scalars(report.policy, report.env_steps,
                              {f"eval/{name}": value for name, value in report.results.items()})

    def write_pbt(self, policy: int) -> None:
        """The policy's current hyper-parameters and objective, under pbt/ (after a PBT decision)."""
        self.recorder.scalars(policy, self.tally.env_steps[policy], self._pbt_values(policy))

    def _pbt_values(self, policy: int) -> dict[str, float]:
        values = {f"pbt/{name}": value for name, value in self.tally.hyperparams[policy].items()}
        objective = self.numbers.mean_objective(policy)
        if objective is not None:
            values["pbt/objective"] = objective
        return values

    def _rating_values(self, policy: int) -> dict[str, float]:
        """The policy's Elo and its win/draw/loss rates against snapshots and other policies, under selfplay/."""
        ratings, name = self.tally.ratings, f"p{policy}"
        if name not in ratings.elo:
            return {}
        values = {"selfplay/elo": ratings.elo[name]}
        for label, snapshots in (("snapshots", True), ("policies", False)):
            record = ratings.against(name, snapshots)
            if record.games:
                values.update((f"selfplay/{outcome}_rate_vs_{label}", rate)
                              for outcome, rate in zip(("win", "draw", "loss"), record.rates()))
        return values


def learning_curve(exp_dir: str, num_policies: int) -> str | None:
    """<exp_dir>/learning_curve.png: episode/reward over env steps, drawn from the run's own tensorboard summaries by
    appo.tools.plot (a panel per policy); None, said in one line, when it cannot be drawn (no matplotlib, no finished
    episode yet)."""
    if not installed("matplotlib"):
        log.info('The learning curve is not drawn: matplotlib is not installed (pip install -e ".[plot]")')
        return None
    from appo.tools.plot import draw, panels, plot

    def draw_policy(ax, policy: int) -> None:
        draw(ax, [exp_dir], policy=policy)
        ax.set_title(f"policy {policy}: episode/reward")

    path = os.path.join(exp_dir, "learning_curve.png")
    try:
        if num_policies == 1:
            plot([exp_dir], path, title=f"{os.path.basename(exp_dir)}: episode/reward")
        else:
            panels(list(range(num_policies)), path, draw_policy)
    except Exception as exc:  # a curve is a nicety: the run's end goes on
        log.info("The learning curve is not drawn: %s", one_line(exc))
        return None
    return path
