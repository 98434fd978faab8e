"""The runner's one handle on reporting: `Reports` composes the intake, the derived numbers, the text, the
summaries (with the Recorder of appo/tracking/: tensorboard and the trackers) and the benchmark summary."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from appo.config.views import RunnerConfig
from appo.messages import ActorReport, ClusterReport, Evaluation, InferenceReport, LearnerReport
from appo.run.reporting.benchmark import benchmark_summary
from appo.run.reporting.episode_record import restore_windows, save_windows
from appo.run.reporting.numbers import Numbers
from appo.run.reporting.summaries import SummaryWriters, learning_curve
from appo.run.reporting.tally import Clock, Tally
from appo.run.reporting.text import StatusText
from appo.tracking import FINISHED, open_recorder
from appo.utils.logs import log
from appo.utils.resources import write_failure

if TYPE_CHECKING:
    from appo.config.flags import Config


class Reports:
    """What the runner calls: the `on_*` intake of the workers' typed reports, `tick` every loop, the printed status
    and summary, the summaries, the numbers its stop rules and PBT read, and the benchmark summary. Owns a Tally
    (intake), its Numbers (derived), a StatusText (printed), SummaryWriters (the summaries) and the Recorder they go
    to (tensorboard under <exp_dir>/summaries/, the JSONL file and the trackers the flags turn on). `cfg`: the run's
    whole Config, which the trackers keep as the run's config. `clock` is time.monotonic, or a test's fake clock."""

    def __init__(self, cfg: Config, exp_dir: str, initial_env_steps: Sequence[int],
                 frames_per_step: int = 1, clock: Clock = time.monotonic) -> None:
        self.cfg, self.exp_dir = RunnerConfig.of(cfg), exp_dir
        self.tally = Tally(self.cfg, initial_env_steps, clock)
        self.numbers = Numbers(self.tally, self.cfg, frames_per_step)
        self.text = StatusText(self.tally, self.numbers, self.cfg)
        self.recorder = open_recorder(cfg, exp_dir, dataclasses.asdict(cfg))
        self.summaries = SummaryWriters(self.tally, self.numbers, self.cfg, self.recorder)
        self.episodes_saved = True  # False once a save failed: said once
        self.raw_limit: dict[str, Any] | None = None  # benchmark mode: the machine's, measured before the workers
        if any(initial_env_steps):  # resumed: the last episodes of the run before count towards the means
            restored = restore_windows(exp_dir, [policy.episodes for policy in self.tally.policies])
            if restored:
                log.info("Restored the last %d episodes of the resumed run (the means over --stats_avg=%d)",
                         restored, self.cfg.stats_avg)

    # ---------------------------------------------------------------- intake
    def on_actor(self, report: ActorReport) -> None:
        self.tally.on_actor(report)

    def on_inference(self, report: InferenceReport) -> None:
        self.tally.on_inference(report)

    def on_learner(self, report: LearnerReport) -> None:
        self.tally.on_learner(report)

    def on_cluster(self, report: ClusterReport) -> None:
        self.tally.on_cluster(report)

    def on_evaluation(self, report: Evaluation) -> None:
        """Keep the newest evaluation for the status line and write all its results under eval/."""
        self.tally.on_evaluation(report)
        self.summaries.write_evaluation(report)

    def tick(self, learner_env_steps: np.ndarray | None = None) -> None:
        """Every runner loop; `learner_env_steps`: SharedControl.learners.env_steps, which learners set after every
        iteration."""
        self.tally.tick(learner_env_steps)
        self.numbers.track_best_rewards()

    # ---------------------------------------------------------------- what the runner sets and reads
    @property
    def env_steps(self) -> list[int]:
        """Each policy's env steps, trained + dropped (the budget's count)."""
        return self.tally.env_steps

    @property
    def states(self) -> dict[str, tuple[str, float]]:
        """Each worker's last reported state and when (clock time), for the stall report."""
        return self.tally.states

    @property
    def last_progress(self) -> float:
        """When (clock time) env steps last moved."""
        return self.tally.last_progress

    @property
    def restarts(self) -> dict[str, int]:
        """Worker restarts per role on this machine (the supervisor's count)."""
        return self.tally.restarts

    @restarts.setter
    def restarts(self, counts: dict[str, int]) -> None:
        self.tally.restarts = counts

    @property
    def hyperparams(self) -> list[dict[str, float]] | None:
        """PBT runs: each policy's current hyper-parameters."""
        return self.tally.hyperparams

    @hyperparams.setter
    def hyperparams(self, values: list[dict[str, float]] | None) -> None:
        self.tally.hyperparams = values

    @property
    def ratings(self) -> Any:
        """appo.population.ratings.Ratings when games have players of different acting ids, else None."""
        return self.tally.ratings

    @ratings.setter
    def ratings(self, ratings: Any) -> None:
        self.tally.ratings = ratings

    # ---------------------------------------------------------------- derived numbers
    def total_env_steps(self) -> int:
        return self.tally.total_env_steps()

    def measured(self) -> tuple[float, int, int]:
        """Seconds, env steps and trained samples of the measured period (every actor sampling)."""
        return self.numbers.measured()

    def progress(self) -> tuple[float, str, float | None] | None:
        """(fraction done, budget in words, seconds left or None) of the budget closest to done; None without one."""
        return self.numbers.progress()

    def solved_policy(self, target: float, measure: str = "reward") -> tuple[int, float] | None:
        return self.numbers.solved_policy(target, measure)

    def objective(self, policy: int) -> float | None:
        """What PBT ranks the policy by: its mean objective over a full --stats_avg window, else None."""
        return self.numbers.objective(policy)

    def objective_error(self, policy: int) -> float | None:
        """The standard error of `objective` (None while unknown), for PBT's gap rule."""
        return self.numbers.objective_error(policy)

    def forget_objective(self, policy: int) -> None:
        """After a policy's weights were replaced it is judged on episodes of its new weights only."""
        self.tally.policies[policy].episodes.forget_objectives()

    def final_stats(self) -> dict[int, dict[str, float]]:
        return self.numbers.final_stats()

    # ---------------------------------------------------------------- output
    def status_line(self) -> str:
        self.numbers.track_best_rewards()
        return self.text.status()

    def summary_line(self, checkpoints: list[str | None]) -> str:
        self.numbers.track_best_rewards()
        return self.text.summary(checkpoints)

    def on_memory(self, memory_mb: dict[str, float]) -> None:
        self.tally.on_memory(memory_mb)

    def write_summaries(self, memory_mb: dict[str, float]) -> None:
        """The summaries, and the episode windows a resumed run starts with (episode_record.py)."""
        self.summaries.write(memory_mb)
        try:
            save_windows(self.exp_dir, [policy.episodes for policy in self.tally.policies])
        except OSError as exc:
            if self.episodes_saved:
                log.error("The last episodes are not saved for a resume: %s", write_failure(self.exp_dir, exc))
            self.episodes_saved = False

    def write_pbt_summaries(self, policy: int) -> None:
        self.summaries.write_pbt(policy)

    def benchmark_summary(self, env_name: str) -> dict[str, Any]:
        return benchmark_summary(self.tally, self.numbers, self.cfg, env_name, self.raw_limit)

    def start_tracking(self) -> None:
        """Start the trackers' threads; the runner calls it once its workers are forked."""
        self.recorder.start()

    def close(self, status: str = FINISHED) -> None:
        """The end of the run (`status`: appo.tracking.run_status of its outcome): with a tracker on, the learning
        curve goes to it; then every writer closes, the trackers within appo.tracking.CLOSE_SECONDS."""
        if self.recorder.tracking:
            curve = learning_curve(self.exp_dir, self.cfg.num_policies)
            if curve is not None:
                self.recorder.artifact(curve, "plots")
        self.recorder.close(status)
