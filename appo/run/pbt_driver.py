"""Population-based training as the runner carries it out: the decisions are pure (appo/population/pbt.py); this
class turns them into messages to the learners, reward shaping in shared memory, files and summaries.

Writes: control.runner.reward_shaping, the population's files in the experiment dir (pbt/), and the hyper-parameters
shown by the reports.
"""

from __future__ import annotations

import random

from appo.config.flags import ELO_OBJECTIVE
from appo.envs import EnvInfo
from appo.messages import ExportWeights, SetHyperparams
from appo.population import pbt
from appo.population.ratings import Ratings
from appo.utils.logs import log
from appo.workers.context import WorkerContext


class PbtDriver:
    """Owns the population (`members`) and its random generator."""

    def __init__(self, ctx: WorkerContext, env: EnvInfo, reports, ratings: Ratings | None):
        """`ratings`: the games between policies, for --pbt_target_objective=elo (None when games have one player
        or one policy)."""
        cfg = ctx.cfg
        self.ctx, self.reports, self.ratings = ctx, reports, ratings
        # With the Elo objective, each policy's rated games when it was last replaced: judged on the games after.
        self.games_before = [0] * cfg.num_policies
        self.settings = pbt.Settings.from_cfg(cfg, pbt.shaping_bounds(env.reward_shaping_bounds))
        self.rng = random.Random(cfg.seed)
        self.members = pbt.restore_population(ctx.exp_dir, cfg, env.reward_shaping, self.settings.shaping_bounds,
                                              self.rng)
        self._publish()

    def hyperparams(self, policy: int) -> dict[str, float]:
        """Policy's current hyper-parameters (a replacement learner starts with them)."""
        return self.members[policy].hyperparams

    def step(self) -> None:
        """Judge the policies whose period is up and carry out the decisions."""
        reports, inboxes = self.reports, self.ctx.queues.learner_inboxes
        events = pbt.decide(reports.env_steps, self._objectives(), self.members, self.settings, self.rng,
                            self._objective_errors())
        for event in events:
            pbt.apply(self.members, event)
            pbt.append_history(self.ctx.exp_dir, event)
            if event.kind == "keep":
                continue
            log.info(event.describe())
            inboxes[event.policy].put(SetHyperparams(event.hyperparams_after))
            if event.donor is not None:
                inboxes[event.donor].put(ExportWeights(event.policy))
                reports.forget_objective(event.policy)
                self._forget_rating(event.policy, event.donor)
        if events:
            self._publish()
            pbt.save_population(self.ctx.exp_dir, self.members)
            for event in events:
                reports.write_pbt_summaries(event.policy)

    def _objectives(self) -> list[float | None]:
        """What each policy is ranked by (None: not yet): the mean objective of its last --stats_avg episodes, or with
        --pbt_target_objective=elo its Elo rating once it has played --stats_avg rated games since it last took over
        another's weights (in a zero-sum game every policy's mean return is 0, whoever wins)."""
        cfg = self.ctx.cfg
        if cfg.pbt_target_objective != ELO_OBJECTIVE:
            return [self.reports.objective(p) for p in range(cfg.num_policies)]
        ratings = self.ratings
        return [ratings.elo.get(f"p{p}") if ratings.games_of(f"p{p}") - self.games_before[p] >= cfg.stats_avg else None
                for p in range(cfg.num_policies)]

    def _objective_errors(self) -> list[float | None]:
        """The standard error of each objective (None: unknown), for the gap rule: of the mean over the window of
        episodes, or unknown for Elo ratings (their games are not independent samples of one mean)."""
        cfg = self.ctx.cfg
        if cfg.pbt_target_objective == ELO_OBJECTIVE:
            return [None] * cfg.num_policies
        return [self.reports.objective_error(p) for p in range(cfg.num_policies)]

    def _forget_rating(self, receiver: int, donor: int) -> None:
        """The receiver plays with the donor's weights now: it starts from the donor's rating, judged anew."""
        if self.ctx.cfg.pbt_target_objective == ELO_OBJECTIVE:
            self.ratings.elo[f"p{receiver}"] = self.ratings.elo.get(f"p{donor}", self.ratings.elo.get(f"p{receiver}"))
            self.games_before[receiver] = self.ratings.games_of(f"p{receiver}")

    def _publish(self) -> None:
        """Reward shaping to the actors (shared memory), hyper-parameters to the summaries and status line."""
        runner = self.ctx.control.runner
        keys = runner.shaping_keys
        for p, member in enumerate(self.members):
            runner.reward_shaping[p, :len(keys)] = [member.shaping[key] for key in keys]
        self.reports.hyperparams = [
            {**member.hyperparams, **{f"shaping_{key}": value for key, value in member.shaping.items()}}
            for member in self.members]
