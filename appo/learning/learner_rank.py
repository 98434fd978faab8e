"""Rank r > 0 of a policy's learner group (--learner_processes_per_policy > 1; how the ranks share the work:
appo/learning/ranks.py). It trains what rank 0 orders, on its share of each minibatch, and writes nothing: no weights,
checkpoints, reports or slots. Rank 0 says when to stop."""

from __future__ import annotations

import torch

from appo.config.hyperparams import Hyperparams
from appo.config.topology import num_acting_ids
from appo.config.views import LearnerConfig
from appo.learning.batching import BatchBuilder
from appo.learning.device import resolve_device
from appo.learning.policy import Policy
from appo.learning.ppo import ppo_updates
from appo.learning.ranks import Order, RankGroup, rank_device, state_from_bytes
from appo.messages import WorkerReady
from appo.utils.process import init_worker
from appo.workers.context import WorkerContext
from appo.workers.roles import WorkerRole


class LearnerRank(WorkerRole):
    """A follower rank: its own copy of the policy, kept identical to rank 0's by taking the same steps."""

    def __init__(self, ctx: WorkerContext, policy_id: int, rank: int):
        flags = Hyperparams.from_cfg(ctx.cfg)  # until rank 0's first order brings the policy's own
        ctx = ctx.for_role(LearnerConfig)
        self.cfg, self.control, self.report_queue = ctx.cfg, ctx.control, ctx.queues.report
        self.name = f"learner_p{policy_id}_r{rank}"
        self.device = rank_device(resolve_device(self.cfg.device), rank, self.cfg.learner_processes_per_policy)
        self.policy = Policy(policy_id, self.cfg, ctx.spaces, self.device, flags)
        self.policy.model.set_bf16_images(self.cfg.learner_bf16)
        self.batches = BatchBuilder(self.cfg, ctx.traj, policy_id, self.device, masked=num_acting_ids(self.cfg) > 1,
                                    action_masks=self.policy.model.masked)
        self.ranks = RankGroup(self.cfg, self.control.learners, policy_id, rank, self.device)
        self.stopped = False

    @classmethod
    def main(cls, ctx: WorkerContext, policy_id: int, rank: int) -> None:
        init_worker(ctx.cfg, cpu=None, single_thread=True)
        torch.set_num_threads(ctx.cfg.learner_torch_threads)
        cls(ctx, policy_id, rank).run()

    def run(self) -> None:
        """Until rank 0 says stop (it does when the run stops)."""
        self.setup()
        while not self.stopped:
            self.step(0.0)
        self.close()

    def setup(self) -> None:
        self.follow(self.ranks.order())  # rank 0's state, to start from
        self.report_queue.put(WorkerReady(self.name))

    def step(self, timeout: float) -> None:
        self.follow(self.ranks.order())

    def close(self) -> None:
        self.ranks.leave()

    def follow(self, order: Order) -> None:
        policy = self.policy
        if order.state is not None:
            policy.load_state_dict(state_from_bytes(order.state, self.device))
        policy.lr_factor = order.lr_factor
        policy.set_hyperparams(order.hyperparams)
        policy.version, policy.min_version, policy.env_steps = order.version, order.min_version, order.env_steps
        if order.kind == "stop":
            self.stopped = True
        if order.kind != "train":
            return
        if order.check_weights:
            self.ranks.checksums(policy.model)
        batch = self.batches.build(order.slots, order.version, order.min_version, policy.hyperparams.gamma)
        self.ranks.barrier()  # rank 0 hands the slots back once every rank has copied them
        if batch.tensors is None:
            return
        policy.apply_learning_rate()
        for _ in ppo_updates(policy.model, policy.optimizer, self.cfg, policy.hyperparams, batch.tensors,
                             ranks=self.ranks):
            pass
