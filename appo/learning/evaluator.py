"""Evaluation during training: deterministic episodes on envs of its own, one process for every policy.

Every `--eval_every_env_steps` of a policy's env steps the runner puts an `EvaluateRequest` in this
process's inbox. The evaluator takes that policy's newest published weights (the shared memory inference
reads, see appo/learning/weights.py), plays `--eval_episodes` whole episodes with the most likely action, one per
env of its own, all envs stepped together with one forward pass per step, and reports the mean return
and length and the env's own episode metrics. Atari plays whole games with unclipped scores. Episode k of
every evaluation starts from seed `EVAL_SEED + k`, so evaluations compare like with like, and
`python -m appo.enjoy --checkpoint=best --deterministic --seed=1000000` replays the best one. When the
evaluation's `--save_best_metric` beats the policy's best so far, it writes the very weights it evaluated
as `checkpoint_p<policy>/best.pth` (and `best.json`: metric, value, version, env steps), apart from the
rolling checkpoints.

It takes the cores' spare time, not the sampler's: one torch thread, at a lower CPU priority than every
other worker, and idle between evaluations. It reads the published weights and writes only `best.pth` and
`best.json`; it sends `Evaluation`, `CheckpointSaved` (for best.pth) and `WorkerReady` to the runner.
"""

from __future__ import annotations

import math

import torch
from faster_fifo import Empty

from appo.config.views import EvaluatorConfig
from appo.envs import make_env
from appo.learning.checkpoint import checkpoint_dir, read_best, save_best
from appo.learning.model import ActorCritic
from appo.learning.trained_policy import TrainedPolicy, episode_env_kwargs, play, summarise
from appo.learning.weights import WeightsSubscriber
from appo.messages import CheckpointSaved, EvaluateRequest, Evaluation, WorkerReady
from appo.utils.logs import log
from appo.utils.process import init_worker
from appo.workers.context import WorkerContext
from appo.workers.roles import WorkerRole

EVAL_SEED = 1_000_000  # evaluation episodes use seeds no actor env starts from
EVAL_NICENESS = 5  # on top of --default_niceness
MAX_STEPS = 1_000_000  # per evaluation: an episode still going then is not counted
INBOX_TIMEOUT_S = 0.1  # the longest a step waits for a request


class Evaluator(WorkerRole):
    """The evaluation process (module docstring): its envs, a CPU model per policy, each policy's best result."""

    STEP_TIMEOUT_S = INBOX_TIMEOUT_S

    def __init__(self, ctx: WorkerContext, num_agents: int):
        ctx = ctx.for_role(EvaluatorConfig)
        cfg = self.cfg = ctx.cfg
        self.spaces, self.num_agents, self.control = ctx.spaces, num_agents, ctx.control
        self.inbox, self.report_queue = ctx.queues.evaluator_inbox, ctx.queues.report
        self.weights_names, self.exp_dir = ctx.weights_names, ctx.exp_dir
        # One env per episode: an evaluation steps them side by side, one forward pass per step for all.
        self.envs = [make_env(cfg.env, episode_env_kwargs(cfg), action_mask=cfg.action_mask)
                     for _ in range(cfg.eval_episodes)]
        self.device = torch.device("cpu")
        self.policies: dict[int, tuple[TrainedPolicy, WeightsSubscriber]] = {}
        # Each policy's best --save_best_metric so far (kept across a resume by best.json).
        self.best: dict[int, float] = {}
        for p in range(cfg.num_policies):
            record = read_best(checkpoint_dir(ctx.exp_dir, p))
            if record is not None and record.get("metric") == cfg.save_best_metric:
                self.best[p] = float(record["value"])
        self.warned_missing_metric = False

    def _policy(self, p: int) -> tuple[TrainedPolicy, WeightsSubscriber]:
        """The policy's model on this process's CPU, attached to its published weights (made on first use)."""
        if p not in self.policies:
            model = ActorCritic(*self.spaces, self.cfg).to(self.device)
            weights = WeightsSubscriber(model, self.weights_names[p], self.control, p)
            self.policies[p] = (TrainedPolicy(model, self.cfg, *self.spaces, self.num_agents, self.device), weights)
        return self.policies[p]

    def evaluate(self, p: int) -> None:
        policy, weights = self._policy(p)
        weights.update()
        policy.version, policy.env_steps = weights.version, int(self.control.learners.env_steps[p])
        episodes = play(policy, self.envs, self.cfg.eval_episodes, True, MAX_STEPS, EVAL_SEED, log_episodes=False)
        if not episodes:
            log.warning("evaluation of policy %d: no episode ended within %d steps", p, MAX_STEPS)
            return
        results = summarise(episodes)
        self.report_queue.put(Evaluation(p, policy.version, policy.env_steps, results))
        self._keep_if_best(p, policy, results)

    def _keep_if_best(self, p: int, policy: TrainedPolicy, results: dict[str, float]) -> None:
        metric = self.cfg.save_best_metric
        value = results.get(metric)
        if value is None or not math.isfinite(value):
            if not self.warned_missing_metric:
                why = (f"the evaluation episodes report no such value (they report {', '.join(sorted(results))})"
                       if value is None else f"it is {value} (from NaN or infinite episode values)")
                log.warning("--save_best_metric=%s: %s; no best checkpoint is kept from such evaluations", metric,
                            why)
                self.warned_missing_metric = True
            return
        if value <= self.best.get(p, -math.inf):
            return
        state = {"model": policy.model.state_dict(), "version": policy.version, "env_steps": policy.env_steps}
        record = {"metric": metric, "value": value, "version": policy.version, "env_steps": policy.env_steps,
                  "results": results}
        path = save_best(checkpoint_dir(self.exp_dir, p), state, record)
        if path is None:
            log.warning("policy %d: best evaluation (%s %.4g) has non-finite weights; not kept", p, metric, value)
            return
        self.best[p] = value
        self.report_queue.put(CheckpointSaved(p, path, policy.version, policy.env_steps, best=record))

    @classmethod
    def main(cls, ctx: WorkerContext, num_agents: int) -> None:
        """The entry point of the evaluator's process: below every other worker's priority, then `run()`."""
        init_worker(ctx.cfg, cpu=None, single_thread=True, extra_niceness=EVAL_NICENESS)
        torch.set_num_threads(1)
        cls(ctx, num_agents).run()


    def setup(self) -> None:
        """The envs are made: ready for requests."""
        self.report_queue.put(WorkerReady("evaluator"))

    def step(self, timeout: float) -> None:
        """Evaluate every policy asked for since the last step (waiting at most `timeout` seconds for a request); a
        request repeated meanwhile runs once."""
        try:
            requests: list[EvaluateRequest] = self.inbox.get_many(timeout=timeout)
        except Empty:
            return
        for p in sorted({request.policy for request in requests}):
            self.evaluate(p)

    def close(self) -> None:
        for env in self.envs:
            env.close()
