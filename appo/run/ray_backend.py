"""--backend=ray: the same trainer, with its sampling spread over the nodes of a Ray cluster.

The head (the machine that runs `python -m appo.train`) keeps the runner, the learners, PBT, the evaluator and
its own trajectory slots, as on one machine. One process of the head, `cluster` (`run_cluster`), is the Ray
driver. It starts a sampler group on the nodes (a Ray actor running `NodeSampler`; the head's record of it is a
`NodeGroup`, whose `handle` is the Ray actor handle) and then loops:

- **pull**: it asks every group for the trajectories its actors finished, copies them into free head slots,
  marks them owed (`SharedControl.slot_owed`) and tells the learners, as a local actor does. So the learners' rules
  apply unchanged: policy lag, dropping, back-pressure. The head's slots are one pool for all groups (sized as on
  one machine, so the groups left after a loss can still fill an iteration); a pull asks for no more trajectories
  than its share of the free slots not promised to another pull, and carries the head's `pause_collection` flags,
  so a learner that falls behind holds the node's actors at their next rollout boundary.
- **weights**: when an acting id's published version moves, the head's weights segment is read once (seqlock)
  and put in Ray's object store once; every group gets the reference. Ray moves an object to a node once, so a
  node receives each version at most once, and a group has at most one transfer in flight per acting id: a slow
  node skips versions instead of queueing them.
- **watch**: a group whose Ray actor died (node removed, process killed) is logged with Ray's cause and replaced
  by a new group for the same workers, which Ray starts once some node has the CPUs for it. Training goes on with
  the other groups meanwhile.
- **report**: the reports of every node's actors and inference workers go to the runner (worker numbers made
  cluster-wide), plus a `ClusterReport` a second with each group's env steps and bytes moved.

A node's group (`NodeSampler`) is a `SamplerGroup` as on one machine (actors, inference workers, shared-memory
slots and counters in the node's memory, supervised there: a dead actor is replaced on its node). The node has no
learners: each pull copies the owed slots out, and releases them to their actors as a learner would
(appo/memory/slots.py). On the head the cluster process writes the trajectory slots and `slot_owed` (as the actors
do on one machine); the learners' wake-ups for the actors come to its inbox.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import secrets
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from faster_fifo import Empty, Full

from appo.config.topology import inference_shards, num_acting_ids
from appo.envs import EnvInfo
from appo.memory.buffers import Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.memory.segments import (
    attach_segment,
    create_segment,
    read_weights,
    remove_orphan_segments,
    unlink_segment,
    weights_segment_name,
    write_weights,
)
from appo.memory.slots import hand_over_slots, release_slots
from appo.messages import ActorReport, ClusterReport, InferenceReport, WorkerFailed, WorkerReady
from appo.run.graph import start_sampler
from appo.run.roles import ACTOR
from appo.run.supervisor import Supervisor
from appo.sampling.sampler_group import sampler_queues
from appo.utils.logs import log
from appo.utils.process import FatalError, init_worker
from appo.utils.queues import DeadHolderWatch, make_queue
from appo.workers.context import Queues, WorkerContext
from appo.workers.roles import WorkerRole

PULL_WAIT_S = 0.02  # a pull with nothing owed waits this long for a trajectory before it returns empty
NODE_STOP_S = 4.0  # how long the head waits for the groups to stop their processes
WAIT_S = 0.05  # the longest a step of the cluster process waits for Ray
IDLE_SLEEP_S = 0.01  # a step with nothing in flight sleeps this long instead
REPORT_INTERVAL_S = 1.0
NODE_REPORT_QUEUE_BYTES = 1_000_000
TRAJ_FIELDS = tuple(name for name in TrajBuffers.FIELDS if name != "obs")


def node_cfg(cfg: Any, layout: Layout, first_worker: int, num_workers: int) -> Any:
    """The flags a group's processes see: its own number of actor workers, and seeds shifted so that every env of
    the cluster gets the seed it would get on one machine. `cfg` is the run's (frozen dataclass) config."""
    seed = None if cfg.seed is None else cfg.seed + first_worker * layout.num_splits * layout.agents_per_split
    return dataclasses.replace(cfg, num_workers=num_workers, seed=seed,
                               policy_workers_per_policy=min(cfg.policy_workers_per_policy, num_workers))


def plan_groups(num_workers: int, node_cpus: list[float], workers_per_node: int) -> list[tuple[int, int]]:
    """(first worker, number of workers) of each sampler group: `workers_per_node` each, or with 0 an even split
    over the nodes that have CPUs."""
    per_group = workers_per_node or math.ceil(num_workers / max(1, len(node_cpus)))
    return [(first, min(per_group, num_workers - first)) for first in range(0, num_workers, per_group)]


class NodeSampler:
    """One node's sampler group and the pulls that hand its trajectories to the head (module docstring). A plain
    class: the head runs it as a Ray actor. Owns the node's shared memory and queues; writes the node's weights
    segments and `control.learners`/`control.runner` flags (copies of the head's), and releases the slots it ships."""

    def __init__(self, cfg: Any, head_layout: Layout, spaces: tuple, shaping_keys: tuple[str, ...],
                 name: str, first_worker: int, num_workers: int):
        remove_orphan_segments()  # weights of groups whose process was killed on this node
        self.name, self.first_worker = name, first_worker
        layout = dataclasses.replace(head_layout, num_workers=num_workers)
        cfg = self.cfg = node_cfg(cfg, head_layout, first_worker, num_workers)
        num_acting = num_acting_ids(cfg)
        control = SharedControl(layout, cfg.num_policies, (len(inference_shards(cfg)), cfg.policy_workers_per_policy),
                                shaping_keys, num_snapshots=num_acting - cfg.num_policies)
        self.traj_hints = make_queue()  # the actors' SlotHints, meant for learners: here they only end a pull's wait
        actor_inboxes, inference_wakeups = sampler_queues(cfg)
        queues = Queues(report=make_queue(NODE_REPORT_QUEUE_BYTES),
                        learner_inboxes=[self.traj_hints] * cfg.num_policies,
                        actor_inboxes=actor_inboxes, inference_wakeups=inference_wakeups)
        token = f"{os.getpid()}_{secrets.token_hex(3)}"
        self.ctx = WorkerContext(cfg, layout, spaces, TrajBuffers(layout), control, queues,
                                 [weights_segment_name(token, i) for i in range(num_acting)])
        self.layout, self.traj, self.control, self.report_queue = layout, self.ctx.traj, control, queues.report
        self.weights: dict[int, np.ndarray] = {}  # acting id -> this node's weights segment
        self.supervisor = Supervisor(self.report_queue, cfg.max_worker_restarts)
        self.group = start_sampler(self.ctx, self.supervisor)
        self.report_watch = DeadHolderWatch(self.report_queue)  # after the fork: a worker killed inside a put
        self.report_watch.start()
        self.reports: list[ActorReport | InferenceReport] = []
        self.failure: str | None = None

    def where(self) -> str:
        """The node's IP address (Ray's name for it)."""
        import ray

        return ray.util.get_node_ip_address()

    def set_weights(self, acting_id: int, version: int, flat: np.ndarray) -> None:
        """Publish weights to this node's inference workers, as a learner publishes on one machine."""
        if acting_id not in self.weights:
            segment = create_segment(self.ctx.weights_names[acting_id], flat.nbytes)
            self.weights[acting_id] = np.ndarray(flat.shape, np.float32, buffer=segment)
        view = self.weights[acting_id]
        write_weights(self.control, acting_id, lambda: np.copyto(view, flat), version)

    def pull(self, pause: np.ndarray, shaping: np.ndarray, max_trajs: int) -> dict:
        """Up to `max_trajs` finished trajectories (waiting PULL_WAIT_S for the first), the reports since the last
        pull, and whether the group is ready or has failed. `pause` and `shaping` are the head's flags."""
        self.control.learners.pause_collection[:] = pause
        self.control.runner.reward_shaping[:] = shaping
        self._supervise()
        slots = self._owed_slots(max_trajs)
        batch = self._collect(slots) if len(slots) else None
        self._drain_reports()
        reports, self.reports = self.reports, []
        return {"batch": batch, "reports": reports, "failure": self.failure,
                "ready": all(worker.ready for worker in self.supervisor.workers.values()),
                "restarts": self.supervisor.restart_counts()}

    def stop(self) -> None:
        self.control.runner.stop[0] = 1
        self.supervisor.join_all(time.monotonic() + NODE_STOP_S - 1.0, self._drain_reports)
        self.report_watch.stop()
        for name in self.ctx.weights_names:
            unlink_segment(name)

    def _supervise(self) -> None:
        if self.failure is not None:
            return
        queues = [*self.group.queues(), ("report queue", self.report_queue), ("trajectory hints", self.traj_hints)]
        self.group.kill_hung_actors(self.supervisor)
        self.failure = self.supervisor.replace_dead(queues, self._drain_reports)
        late = self.supervisor.not_ready_after(ACTOR, self.cfg.reset_timeout_seconds)
        if self.failure is None and late:
            self.failure = (f"{', '.join(late)} did not create and reset its envs within --reset_timeout_seconds="
                            f"{self.cfg.reset_timeout_seconds:g} of starting")

    def _owed_slots(self, max_trajs: int) -> np.ndarray:
        deadline = time.monotonic() + PULL_WAIT_S
        while True:
            with contextlib.suppress(Empty):  # hints only wake this wait: the flags say what is owed
                self.traj_hints.get_many(timeout=0.0)
            slots = np.flatnonzero(self.control.slot_owed.any(axis=0))
            remaining = deadline - time.monotonic()
            if len(slots) or max_trajs <= 0 or remaining <= 0:
                return slots[:max(max_trajs, 0)]
            with contextlib.suppress(Empty):
                self.traj_hints.get_many(timeout=remaining)

    def _collect(self, slots: np.ndarray) -> dict:
        """Copy the slots out, then release them: clear the flags that were read (an actor may still be raising
        another policy's) and wake the actors that own them."""
        batch = {name: getattr(self.traj, name)[slots] for name in TRAJ_FIELDS}
        batch["obs"] = {key: array[slots] for key, array in self.traj.obs.items()}
        owed = self.control.slot_owed[:, slots].copy()
        policies, columns = np.nonzero(owed)
        release_slots(self.control, self.layout, self.ctx.queues.actor_inboxes, policies, slots[columns])
        batch["owed"] = owed
        return batch

    def _drain_reports(self) -> None:
        """Take the node's reports: readiness and failures for its supervisor, the actors' and inference workers'
        reports for the head (renamed cluster-wide)."""
        try:
            messages = self.report_queue.get_many(timeout=0.0)
        except Empty:
            return
        for message in messages:
            match message:
                case WorkerReady():
                    self.supervisor.on_ready(message.name)
                case WorkerFailed():
                    self.supervisor.on_failed(message)
                case ActorReport():
                    self.reports.append(dataclasses.replace(message, worker=self.first_worker + message.worker))
                case InferenceReport():
                    self.reports.append(dataclasses.replace(message, name=f"{self.name}/{message.name}"))


@dataclasses.dataclass
class NodeGroup:
    """The head's record of one sampler group: where it runs, what is in flight to and from it, what it moved."""

    name: str  # n0, n1, ...: the group, whichever node runs it
    first_worker: int
    num_workers: int
    num_cpus: float  # what the group asks Ray for
    handle: Any = None  # the Ray actor handle of its NodeSampler
    started: Any = None  # ObjectRef of where(), until the group runs
    node: str = ""  # the node's IP once the group runs
    running: bool = False
    ready: bool = False  # every process of the group has started
    pull: Any = None  # ObjectRef of the pull in flight
    promised: int = 0  # head slots kept free for the pull in flight
    weights_sent: dict = dataclasses.field(default_factory=dict)  # acting id -> newest version sent
    weights_in_flight: dict = dataclasses.field(default_factory=dict)  # ObjectRef -> acting id
    restarts: dict = dataclasses.field(default_factory=dict)  # the node's worker restarts per role
    replacements: int = 0
    lost: str = ""  # why the previous instance died, until the replacement runs
    # since the last report
    env_steps: int = 0
    traj_bytes: int = 0
    weights_bytes: int = 0

    @property
    def workers_text(self) -> str:
        last = self.first_worker + self.num_workers - 1
        return f"actor worker {last}" if last == self.first_worker else f"actor workers {self.first_worker}-{last}"


class WeightsRelay:
    """The head's published weights as Ray objects for the nodes: each acting id's segment is read once per version
    (seqlock) and put in Ray's object store once. Reads the head's weights segments; writes nothing shared."""

    def __init__(self, ctx: WorkerContext):
        self.control, self.weights_names = ctx.control, ctx.weights_names
        self.num_acting = num_acting_ids(ctx.cfg)
        self.segments: dict[int, np.ndarray] = {}  # acting id -> the head's segment, attached on first use
        self.published: dict[int, tuple[int, Any, int]] = {}  # acting id -> (version, ObjectRef, bytes)

    def newest(self) -> Iterator[tuple[int, int, Any, int]]:
        """(acting id, version, ObjectRef, bytes) of each acting id's newest weights, for those published yet."""
        import ray

        for acting_id in range(self.num_acting):
            version = int(self.control.learners.policy_version[acting_id])
            if version < 0:
                continue
            if acting_id not in self.published or self.published[acting_id][0] != version:
                if acting_id not in self.segments:
                    segment = attach_segment(self.weights_names[acting_id])
                    self.segments[acting_id] = np.ndarray((len(segment) // 4,), np.float32, buffer=segment)
                flat = read_weights(self.control, acting_id, self.segments[acting_id].copy)
                self.published[acting_id] = (version, ray.put(flat), flat.nbytes)
            yield acting_id, *self.published[acting_id]


class Cluster(WorkerRole):
    """The head's Ray driver (module docstring). Writes the head's trajectory slots and their `slot_owed` flags."""

    STEP_TIMEOUT_S = WAIT_S

    def __init__(self, ctx: WorkerContext, env: EnvInfo):
        self.cfg, self.layout, self.env, self.traj, self.control = ctx.cfg, ctx.layout, env, ctx.traj, ctx.control
        self.learner_inboxes, self.report_queue = ctx.queues.learner_inboxes, ctx.queues.report
        self.inbox = ctx.queues.actor_inboxes[0]  # every actor inbox of the head is this process's
        self.weights = WeightsRelay(ctx)
        self.groups: list[NodeGroup] = []
        self.started = self.last_report = time.monotonic()
        self.reported_ready = False
        self.busy = 0.0  # seconds spent moving data since the last report (the rest is waiting on Ray)

    # ---------------------------------------------------------------- main loop
    @classmethod
    def main(cls, ctx: WorkerContext, env: EnvInfo) -> None:
        """The entry point of the head's cluster process."""
        init_worker(ctx.cfg, cpu=None, single_thread=True)
        cls(ctx, env).run()

    def run(self) -> None:
        """As every role's; the sampler groups on the nodes are stopped however the loop ends."""
        try:
            super().run()
        except BaseException:
            self.close()
            raise


    def setup(self) -> None:
        """Join the Ray cluster and start a sampler group per `plan_groups`."""
        import ray

        address = self.cfg.ray_address or None
        try:
            ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR)
        except Exception as exc:  # ConnectionError, or Ray's own for a bad address
            raise FatalError(f"--ray_address={self.cfg.ray_address!r}: cannot join a Ray cluster there "
                             f"({type(exc).__name__}: {str(exc).strip().splitlines()[0]})") from exc
        nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
        if not nodes:
            raise FatalError(f"the Ray cluster at {address or 'this machine'} has no node with a CPU to sample on")
        cpus = [n["Resources"]["CPU"] for n in nodes]
        self.remote_sampler = ray.remote(max_restarts=0)(NodeSampler)
        for k, (first, count) in enumerate(plan_groups(self.cfg.num_workers, cpus, self.cfg.ray_workers_per_node)):
            group = NodeGroup(f"n{k}", first, count, num_cpus=min(count, min(cpus)))
            self.groups.append(group)
            self._start_group(group)
        log.info("cluster: %d nodes with %s CPUs; %d sampler groups of %s actor workers", len(nodes),
                 "/".join(f"{c:g}" for c in cpus), len(self.groups), "/".join(str(g.num_workers) for g in self.groups))
        self.last_report = time.monotonic()

    def _start_group(self, group: NodeGroup) -> None:
        spaces = (self.env.obs_space, self.env.action_space)
        group.handle = self.remote_sampler.options(num_cpus=group.num_cpus, scheduling_strategy="SPREAD").remote(
            self.cfg, self.layout, spaces, self.control.runner.shaping_keys, group.name, group.first_worker,
            group.num_workers)
        group.started = group.handle.where.remote()
        group.running = group.ready = False
        group.pull, group.promised, group.weights_sent, group.weights_in_flight = None, 0, {}, {}

    def step(self, timeout: float) -> None:
        """Send new weights, ask the idle groups for trajectories, wait at most `timeout` seconds for Ray and take
        what came back; a report when one is due."""
        self._exchange(timeout)
        now = time.monotonic()
        if now - self.last_report >= REPORT_INTERVAL_S:
            self._report(now - self.last_report)
            self.last_report = now

    def _exchange(self, timeout: float) -> None:
        import ray

        with contextlib.suppress(Empty):  # the learners' wake-ups: free slots are read from slot_owed
            self.inbox.get_many(timeout=0.0)
        begin = time.monotonic()
        self._send_weights()
        self._ask_for_trajectories()
        waiting = {}
        for group in self.groups:
            if group.started is not None:
                waiting[group.started] = (group, "started")
            if group.pull is not None:
                waiting[group.pull] = (group, "pull")
            for ref in group.weights_in_flight:
                waiting[ref] = (group, "weights")
        self.busy += time.monotonic() - begin
        if not waiting:
            time.sleep(min(timeout, IDLE_SLEEP_S))
            return
        ready, _ = ray.wait(list(waiting), num_returns=1, timeout=timeout)
        if ready:
            more, _ = ray.wait([ref for ref in waiting if ref not in ready], num_returns=len(waiting) - len(ready),
                               timeout=0)
            ready += more
        begin = time.monotonic()
        for ref in ready:
            group, what = waiting[ref]
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._lost(group, exc)
                continue
            if what == "started":
                self._on_started(group, result)
            elif what == "pull":
                group.pull, group.promised = None, 0
                self._import(group, result)
            else:
                del group.weights_in_flight[ref]
        self.busy += time.monotonic() - begin
        self._check_ready()

    def _ask_for_trajectories(self) -> None:
        """A pull for every running group without one in flight, each for its share of the unpromised free slots."""
        asking = [group for group in self.groups if group.running and group.pull is None]
        if not asking:
            return
        unpromised = len(self._free_slots()) - sum(group.promised for group in self.groups)
        share = unpromised // len(asking)
        for group in asking if share > 0 else []:
            group.promised = share
            group.pull = group.handle.pull.remote(self.control.learners.pause_collection.copy(),
                                                  self.control.runner.reward_shaping.copy(), share)

    def _on_started(self, group: NodeGroup, node: str) -> None:
        group.started, group.running, group.node = None, True, node
        if group.lost:
            log.warning("cluster: sampler group %s (%s) replaced on node %s", group.name, group.workers_text, node)
            group.lost = ""
        else:
            log.info("cluster: sampler group %s (%s) runs on node %s", group.name, group.workers_text, node)

    def _lost(self, group: NodeGroup, exc: Exception) -> None:
        """A group's Ray actor died: say why, and start a replacement (Ray places it when resources allow)."""
        import ray

        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        cause = next((line for line in lines if "died" in line or "lost" in line or "killed" in line),
                     lines[0] if lines else type(exc).__name__)
        group.lost = type(exc).__name__
        group.replacements += 1
        running = sum(g.num_workers for g in self.groups if g.running and g is not group)
        log.warning("cluster: sampler group %s on node %s lost (%s: %s); training goes on with %d of %d actor "
                    "workers; a replacement starts when a node has %g free CPUs", group.name, group.node or "?",
                    type(exc).__name__, cause[:200], running, self.cfg.num_workers, group.num_cpus)
        with contextlib.suppress(Exception):
            ray.kill(group.handle, no_restart=True)
        self._start_group(group)
        group.node = ""

    def _check_ready(self) -> None:
        """Ready for the runner (its stall detection starts then) once every group's processes run, or half of
        --reset_timeout_seconds after the start when some do. The runner stops a run whose cluster process is not
        ready after --reset_timeout_seconds."""
        if self.reported_ready:
            return
        ready = sum(group.ready for group in self.groups)
        if ready < len(self.groups):
            if not ready or time.monotonic() - self.started < self.cfg.reset_timeout_seconds / 2:
                return
            log.warning("cluster: going on with %d of %d sampler groups; the others wait for Ray to place them "
                        "(each asks for %g CPUs on one node)", ready, len(self.groups), self.groups[0].num_cpus)
        self.report_queue.put(WorkerReady("cluster"))
        self.reported_ready = True

    # ---------------------------------------------------------------- data
    def _free_slots(self) -> np.ndarray:
        """Head slots that no learner owes a read (only this process fills them)."""
        return np.flatnonzero(~self.control.slot_owed.any(axis=0))

    def _import(self, group: NodeGroup, result: dict) -> None:
        for report in result["reports"]:
            if isinstance(report, ActorReport):
                group.env_steps += report.env_steps
            with contextlib.suppress(Full):
                self.report_queue.put_nowait(report)
        group.restarts = result["restarts"]
        group.ready = group.ready or result["ready"]
        if result["failure"]:
            raise FatalError(f"sampler group {group.name} on node {group.node}: {result['failure']}")
        batch = result["batch"]
        if batch is None:
            return
        owed = batch.pop("owed")
        slots = self._free_slots()[:owed.shape[1]]
        for key, array in batch.pop("obs").items():
            self.traj.obs[key][slots] = array
            group.traj_bytes += array.nbytes
        for name, array in batch.items():
            getattr(self.traj, name)[slots] = array
            group.traj_bytes += array.nbytes
        for policy in range(self.cfg.num_policies):  # as an actor does
            mine = slots[owed[policy] > 0]
            if len(mine):
                hand_over_slots(self.control, self.learner_inboxes, policy, mine.tolist())

    def _send_weights(self) -> None:
        """Every acting id's newest published weights to every running group that lacks them (one transfer in
        flight per group and id)."""
        for acting_id, version, ref, nbytes in self.weights.newest():
            for group in self.groups:
                if (group.running and group.weights_sent.get(acting_id) != version
                        and acting_id not in group.weights_in_flight.values()):
                    group.weights_in_flight[group.handle.set_weights.remote(acting_id, version, ref)] = acting_id
                    group.weights_sent[acting_id] = version
                    group.weights_bytes += nbytes

    # ---------------------------------------------------------------- reports and stop
    def _report(self, seconds: float) -> None:
        groups = []
        for group in self.groups:
            groups.append({"name": group.name, "node": group.node, "workers": group.num_workers,
                           "running": group.running, "lost": group.lost, "replacements": group.replacements,
                           "env_steps": group.env_steps, "traj_bytes": group.traj_bytes,
                           "weights_bytes": group.weights_bytes, "restarts": group.restarts})
            group.env_steps = group.traj_bytes = group.weights_bytes = 0
        with contextlib.suppress(Full):
            self.report_queue.put_nowait(ClusterReport(seconds, self.busy, groups))
        self.busy = 0.0

    def close(self) -> None:
        """Stop every group's processes (waiting at most NODE_STOP_S), end their Ray actors, leave the cluster."""
        import ray

        stopping = [group.handle.stop.remote() for group in self.groups if group.running]
        with contextlib.suppress(Exception):
            ray.wait(stopping, num_returns=len(stopping), timeout=NODE_STOP_S)
        for group in self.groups:
            with contextlib.suppress(Exception):
                ray.kill(group.handle, no_restart=True)
        ray.shutdown()
