"""Population-based training as the runner carries it out: the decisions are pure (appo/population/pbt.py); this
class turns them into messages to the learners, reward shaping in shared memory, files and summaries.

Writes: control.runner.reward_shaping, the population's files in the experiment dir (pbt/), and the hyper-parameters
shown by the reports.
"""

from __future__ import annotations

import random

from appo.memory.context import WorkerContext
from appo.messages import ExportWeights, SetHyperparams
from appo.population import pbt
from envs import EnvInfo
from utils.logs import log


class PbtDriver:
    """Owns the population (`members`) and its random generator."""

    def __init__(self, ctx: WorkerContext, env: EnvInfo, reports):
        cfg = ctx.cfg
        self.ctx, self.reports = ctx, reports
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
        objectives = [reports.objective(p) for p in range(self.ctx.cfg.num_policies)]
        events = pbt.decide(reports.env_steps, objectives, self.members, self.settings, self.rng)
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
        if events:
            self._publish()
            pbt.save_population(self.ctx.exp_dir, self.members)
            for event in events:
                reports.write_pbt_summaries(event.policy)

    def _publish(self) -> None:
        """Reward shaping to the actors (shared memory), hyper-parameters to the summaries and status line."""
        runner = self.ctx.control.runner
        keys = runner.shaping_keys
        for p, member in enumerate(self.members):
            runner.reward_shaping[p, :len(keys)] = [member.shaping[key] for key in keys]
        self.reports.hyperparams = [
            {**member.hyperparams, **{f"shaping_{key}": value for key, value in member.shaping.items()}}
            for member in self.members]
