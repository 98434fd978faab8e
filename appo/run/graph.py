"""The process graph of a run, on one screen: what shared memory and queues exist, which workers start (of which
role, appo/run/roles.py), with which arguments, and which queue each reads.

    actor_w  --request counters-->  inference (shard, index)  --answer counters + WAKE-->  actor_w
    actor_w  --slot_owed + SlotHint-->  learner_p  --weights segment + version-->  inference, evaluator
    learner_p (rank 0)  --orders, gradients (torch.distributed)-->  learner_p_r1..  (--learner_processes_per_policy)
    learner_p  --WAKE (slots released)-->  actor_w;  every worker  --reports-->  runner (report queue)
    runner  --SetHyperparams / ExportWeights-->  learner_p  --AdoptWeights-->  learner_q;  runner --> evaluator

With --backend=ray the actors and inference workers run on the nodes (appo/run/ray_backend.py): one `cluster`
process of the head stands in for the actors, copying the nodes' trajectories into the head's slots.
"""

from __future__ import annotations

from collections.abc import Callable

from appo.config.topology import inference_name, inference_shards, num_acting_ids
from appo.envs import EnvInfo
from appo.memory.buffers import Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.memory.segments import weights_segment_name
from appo.run.roles import ACTOR, CLUSTER, EVALUATOR, INFERENCE, LEARNER, LEARNER_RANK
from appo.sampling.sampler_group import SamplerGroup, sampler_queues
from appo.utils.queues import make_queue
from appo.workers.context import Queues, WorkerContext

# 1 MB holds many seconds of reports (the runner drains it every 50 ms). A bigger ring only makes each worker's
# resident memory creep up for longer: RSS counts the shared pages a process has touched, and a ring's messages
# move through all of its pages (10 MB took 45 min with 4 CartPole actors).
REPORT_QUEUE_BYTES = 1_000_000


def build_context(cfg, env: EnvInfo, exp_dir: str, run_token: str) -> WorkerContext:
    """Allocate the run's shared memory and queues (before any worker is forked, so all of them share it)."""
    layout = Layout.from_cfg(cfg, env.obs_space, env.action_space, env.num_agents)
    num_acting = num_acting_ids(cfg)  # policies and their self-play snapshots
    control = SharedControl(layout, cfg.num_policies, (len(inference_shards(cfg)), cfg.policy_workers_per_policy),
                            tuple(env.reward_shaping), num_snapshots=num_acting - cfg.num_policies)
    if cfg.backend == "local":  # the sampler runs here, in these buffers
        actor_inboxes, inference_wakeups = sampler_queues(cfg)
    else:  # the cluster process stands in for every actor: the learners' wake-ups go to its inbox
        actor_inboxes, inference_wakeups = [make_queue()] * cfg.num_workers, []
    queues = Queues(report=make_queue(REPORT_QUEUE_BYTES),
                    learner_inboxes=[make_queue() for _ in range(cfg.num_policies)],
                    actor_inboxes=actor_inboxes, inference_wakeups=inference_wakeups,
                    evaluator_inbox=make_queue() if cfg.eval_every_env_steps else None)
    return WorkerContext(cfg, layout, (env.obs_space, env.action_space), TrajBuffers(layout), control, queues,
                         [weights_segment_name(run_token, i) for i in range(num_acting)], exp_dir)


def start_workers(ctx: WorkerContext, env: EnvInfo, supervisor, hyperparams: Callable[[int], dict | None],
                  report_iterations: bool) -> SamplerGroup | None:
    """Start every worker of the run (their roles: appo/run/roles.py); returns the sampler group (None when the
    Ray cluster samples).

    `hyperparams(p)` gives policy p's current PBT hyper-parameters at each (re)start of its learner."""
    cfg, queues = ctx.cfg, ctx.queues
    for p in range(cfg.num_policies):  # rank 0, then the other ranks of its group (appo/learning/ranks.py)
        group = f"learner_p{p}"
        supervisor.add(group, LEARNER, lambda p=p: (ctx, p, hyperparams(p), report_iterations),
                       inbox=queues.learner_inboxes[p], group=group)
        for rank in range(1, cfg.learner_processes_per_policy):
            supervisor.add(f"{group}_r{rank}", LEARNER_RANK, lambda p=p, rank=rank: (ctx, p, rank), inbox=None,
                           group=group)
    if queues.evaluator_inbox is not None:
        supervisor.add("evaluator", EVALUATOR, lambda: (ctx, env.num_agents), inbox=queues.evaluator_inbox)
    if cfg.backend == "local":
        return start_sampler(ctx, supervisor)
    supervisor.add("cluster", CLUSTER, lambda: (ctx, env), inbox=queues.actor_inboxes[0])
    return None


def start_sampler(ctx: WorkerContext, supervisor) -> SamplerGroup:
    """Start the inference workers, then the actors, of one machine (this one, or a Ray node's `NodeSampler`);
    `ctx.queues` must hold their `sampler_queues`."""
    for shard, wakeups in enumerate(ctx.queues.inference_wakeups):
        for i, wakeup in enumerate(wakeups):
            supervisor.add(inference_name(ctx.cfg, shard, i), INFERENCE, lambda shard=shard, i=i: (ctx, shard, i),
                           inbox=wakeup)
    for w, inbox in enumerate(ctx.queues.actor_inboxes):
        supervisor.add(f"actor_{w}", ACTOR, lambda w=w: (ctx, w), inbox=inbox)
    return SamplerGroup(ctx)


def named_queues(ctx: WorkerContext, group: SamplerGroup | None) -> list[tuple[str, object]]:
    """Every queue of the run with a readable name (for the repair after a death, see utils/queues.py)."""
    queues = ctx.queues
    named = [("report queue", queues.report)]
    named += [(f"learner_p{p} inbox", q) for p, q in enumerate(queues.learner_inboxes)]
    if queues.evaluator_inbox is not None:
        named.append(("evaluator inbox", queues.evaluator_inbox))
    if group is not None:
        named += group.queues()
    else:
        named.append(("cluster inbox", queues.actor_inboxes[0]))
    return named
