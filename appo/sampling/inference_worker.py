"""Inference (policy) worker: one batched forward pass per policy over every pending request.

A request (a bumped `request_count[policy, worker, split]`, with the step in `request_step`) says: the
env-agents of that split acting for this policy have their observation at step t of their current slots.
The worker finds every pending request of the actors it serves (`worker % --policy_workers_per_policy`),
gathers their observations, runs each policy's model once, writes actions, log-probs, values, versions and
next RNN states into the same slots, and bumps the answer counters; actors asleep get a wake-up (WAKE).
A worker serves the acting ids of one inference shard (appo/config/topology.py): one policy and its snapshots,
or with --shared_inference_workers every policy: with several policies each split step asks every policy acting
in it, and one process answering all of them saves a process wake-up per policy.

Non-finite observations are set to 0 before the forward pass (in the batch and in the slots, so the
learner trains on what the policy saw), logged once per env and counted. Everything a replacement
needs after a crash is in shared memory: it answers whatever requests are pending.

Writes: control.inference.answer_count (of the actors it serves) and idle[shard, index]; in the requested slots'
steps traj.actions, log_probs, values, policy_versions, rnn_states (the next step's) and zeroed non-finite obs.
Sends: WAKE to sleeping actors, WorkerReady and InferenceReport to the runner.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
from faster_fifo import Empty

from appo.config.topology import inference_name, inference_shards, num_acting_ids
from appo.config.views import InferenceConfig
from appo.learning.device import resolve_device
from appo.learning.model import ActorCritic
from appo.learning.weights import WeightsSubscriber
from appo.memory.buffers import WAKE_TIMEOUT_S
from appo.messages import WAKE, InferenceReport, WorkerReady
from appo.spaces import MASK_KEY
from appo.utils.logs import log
from appo.utils.process import init_worker
from appo.utils.timing import Timing
from appo.workers.context import WorkerContext
from appo.workers.roles import WorkerRole

REPORT_INTERVAL_S = 1.0
# A small batch waits at most this long for more requests (see InferenceWorker._next_requests).
MAX_BATCH_WAIT_S = 0.002


class InferenceWorker(WorkerRole):
    """Serves the requests of its shard's acting ids (`policies`) from the actors w with
    w % --policy_workers_per_policy == index: one forward pass per acting id over every pending request.

    `setup()` loads the weights; `step(timeout)` serves one batch, blocking at most `timeout` seconds."""

    STEP_TIMEOUT_S = WAKE_TIMEOUT_S

    def __init__(self, ctx: WorkerContext, shard: int, index: int):
        ctx = ctx.for_role(InferenceConfig)  # the flags this role reads, and no others
        cfg, layout, control = ctx.cfg, ctx.layout, ctx.control
        self.cfg, self.layout, self.shard, self.index = cfg, layout, shard, index
        self.policies = inference_shards(cfg)[shard]  # consecutive acting ids
        self.name = inference_name(cfg, shard, index)
        self.control, self.wakeups = control, ctx.queues.inference_wakeups[shard][index]
        # The actors this worker serves, and views of their request and answer counters [policy, worker, split].
        k, served = cfg.policy_workers_per_policy, slice(self.policies[0], self.policies[-1] + 1)
        self.workers = np.arange(index, cfg.num_workers, k)
        self.request_count = control.actors.request_count[served, index::k]
        self.answer_count = control.inference.answer_count[served, index::k]
        self.request_step = control.actors.request_step[served, index::k]
        self.actor_inboxes, self.report_queue = ctx.queues.actor_inboxes, ctx.queues.report
        self.device = resolve_device(cfg.device)
        self.traj = ctx.traj
        self.models = [ActorCritic(*ctx.spaces, cfg).to(self.device).eval() for _ in self.policies]
        for model in self.models:
            model.set_bf16_images(cfg.inference_bf16)
        # Attached in `setup` (a policy's: it waits there for its learner's first publication) or, for a self-play
        # snapshot (acting id >= --num_policies, which may not exist yet), at its first request.
        self.weights_names = ctx.weights_names
        self.weights: list[WeightsSubscriber | None] = [None] * len(self.policies)
        self.single_id = num_acting_ids(cfg) == 1
        # A seat waiting for its turn (an action mask that allows nothing) needs no forward pass where nothing reads
        # its action, log-probability or value: GAE passes waiting steps through (`losses.turn_gae`). V-trace and a
        # recurrent core read every step.
        self.skip_waiting = self.models[0].masked and not cfg.use_rnn and not cfg.with_vtrace
        self.generator = torch.Generator(self.device)
        if cfg.seed is not None:
            self.generator.manual_seed(cfg.seed + 7919 * (shard * k + index))
        else:
            self.generator.seed()
        self.timing = Timing()
        self.samples = 0
        self.batches = 0
        self.requests = 0
        self.nonfinite = 0
        self.nonfinite_reported: set[tuple[int, int]] = set()  # (worker, env) already logged
        # Each forward pass has a fixed cost (0.2 ms of torch dispatch on CPU warm, several times that
        # with caches cold) whatever its size. With many (worker, split) streams sending requests, batches
        # of a few requests would spend most of the CPU on that cost, so a batch waits for a quarter of
        # the streams. Every stream asks once per split step, so that wait is about a quarter of a split's
        # step (capped at MAX_BATCH_WAIT_S), and the other split of a double-buffered actor still steps.
        # 64 sleep-env workers: an eighth of the streams cost 7.7 us of inference CPU per env step, a
        # quarter 5.1 us.
        streams = len(self.workers) * cfg.worker_num_splits
        self.min_batch_requests = max(1, streams // 4)
        self.request_rate = 0.0  # streams asking per second, measured over the last report interval
        self.last_report = time.monotonic()

    @classmethod
    def main(cls, ctx: WorkerContext, shard: int, index: int) -> None:
        """The entry point of the inference process: one thread for torch, then `run()`."""
        init_worker(ctx.cfg, cpu=None, single_thread=True)
        torch.set_num_threads(1)
        cls(ctx, shard, index).run()


    def setup(self) -> None:
        """Load the published weights of the policies (waiting for their learners' first publication; a
        snapshot's come at its first request), report ready."""
        for local, p in enumerate(self.policies):
            if p < self.cfg.num_policies:
                self._weights(local).update()
        self.report_queue.put(WorkerReady(self.name))
        self.last_report = time.monotonic()

    def step(self, timeout: float) -> None:
        """Serve every pending request (waiting at most `timeout` seconds for some), report once a second."""
        with self.timing.time("wait"):
            requests = self._next_requests(timeout)
        if len(requests[0]):
            self._serve(requests)
            with self.timing.time("forward"):  # answering is part of serving in the time shares
                self._answer(requests)
        now = time.monotonic()
        if now - self.last_report > REPORT_INTERVAL_S:
            self.request_rate = self.requests / (now - self.last_report)
            self.report()

    def close(self) -> None:
        self.report()

    def _weights(self, local: int) -> WeightsSubscriber:
        if self.weights[local] is None:
            p = self.policies[local]
            self.weights[local] = WeightsSubscriber(self.models[local], self.weights_names[p], self.control, p)
        return self.weights[local]

    def _pending(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(policy among this worker's, row in this worker's share of actors, split) of every unanswered request."""
        return np.nonzero(self.request_count != self.answer_count)

    def _streams(self, requests: tuple[np.ndarray, ...]) -> int:
        """(worker, split) streams with a request pending; a split step asks every policy acting in it at once."""
        if len(self.policies) == 1:
            return len(requests[0])
        return len(set(zip(requests[1].tolist(), requests[2].tolist())))

    def _next_requests(self, timeout: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every pending request; when fewer streams than min_batch_requests ask, after a wait for the missing
        ones. With none pending, wait on the wake-up queue (actors send a wake-up while `idle` is raised).
        No wait is longer than `timeout`."""
        requests = self._pending()
        if not len(requests[0]):
            idle = self.control.inference.idle[self.shard]
            idle[self.index] = 1
            requests = self._pending()  # a request may have come before the flag was seen
            if not len(requests[0]):
                with contextlib.suppress(Empty):
                    self.wakeups.get_many(block=timeout > 0, timeout=min(timeout, WAKE_TIMEOUT_S))
                requests = self._pending()
            idle[self.index] = 0
        missing = self.min_batch_requests - self._streams(requests)
        if len(requests[0]) and missing > 0 and self.request_rate > 0 and timeout > 0:
            time.sleep(min(MAX_BATCH_WAIT_S, timeout, missing / self.request_rate))
            requests = self._pending()
        return requests

    def _locate(self, requests: tuple[np.ndarray, np.ndarray, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Slot, step and acting id (None when only one id exists) of every env-agent the requests name, ordered
        by acting id: a request of id k for split s covers the agents of s that id k acts for."""
        local, rows, splits = requests
        workers = self.workers[rows]
        slots = self.control.actors.cur_slot[workers, splits]  # [requests, agents per split]
        steps = np.repeat(self.request_step[local, rows, splits], slots.shape[1])
        if self.single_id:
            return slots.ravel(), steps, None
        acting = self.control.actors.agent_policy[workers, splits].ravel()
        mine = acting == np.repeat(np.asarray(self.policies)[local], slots.shape[1])
        order = np.argsort(acting[mine], kind="stable")
        return slots.ravel()[mine][order], steps[mine][order], acting[mine][order]

    @torch.inference_mode()  # no autograd bookkeeping at all: about 5% of a small batch
    def _serve(self, requests: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Actions for every pending request: one gather, one forward pass per acting id (its rows are consecutive),
        one sampling and one scatter for all of them. With self-play many snapshot ids act at once, and the
        per-id share of the work is then only its forward pass."""
        # Gathers and scatters go through numpy views of the shared memory: for the small index sets of
        # one batch numpy's fancy indexing costs a fraction of torch's. Torch runs only the model.
        timing, traj, device = self.timing, self.traj, self.device
        with timing.time("forward"):
            slots, steps, acting = self._locate(requests)
            obs, moving = {}, None
            for key, array in traj.obs.items():
                rows = array[slots, steps]
                if rows.dtype.kind == "f" and not np.isfinite(rows).all():
                    rows = self._sanitize(key, array, rows, slots, steps)
                if key == MASK_KEY and self.skip_waiting:
                    moving = (rows > 0).any(axis=-1)
                obs[key] = torch.from_numpy(rows).to(device)
            rnn_states = torch.from_numpy(traj.rnn_states[slots, steps]).to(device)
        if acting is None:
            id_rows = [(0, 0, len(slots))]  # (acting id among this worker's, first row, end row)
        else:
            ids, starts = np.unique(acting, return_index=True)
            ends = [*starts[1:].tolist(), len(slots)]
            id_rows = [(i - self.policies[0], a, b) for i, a, b in zip(ids.tolist(), starts.tolist(), ends)]
        outputs, versions = [], []
        for local, begin, end in id_rows:
            with timing.time("weights"):
                weights = self._weights(local)
                weights.update()
            with timing.time("forward"):
                part = slice(begin, end) if len(id_rows) > 1 else slice(None)
                outputs.append(forward_moving(self.models[local], {key: x[part] for key, x in obs.items()},
                                              rnn_states[part], None if moving is None else moving[part]))
                versions.append(weights.version)
        with timing.time("forward"):
            params, values, next_rnn_states = (torch.cat(parts) for parts in zip(*outputs)) if len(id_rows) > 1 \
                else outputs[0]
            dist = self.models[0].distribution(params)  # every acting id has the same action space
            actions = dist.sample(self.generator)
            log_probs = dist.log_prob(actions)
            traj.actions[slots, steps] = actions.cpu().numpy()
            traj.log_probs[slots, steps] = log_probs.cpu().numpy()
            traj.values[slots, steps] = values.cpu().numpy()
            traj.policy_versions[slots, steps] = (versions[0] if len(id_rows) == 1 else
                                                  np.repeat(versions, [end - begin for _, begin, end in id_rows]))
            if self.cfg.use_rnn:
                traj.rnn_states[slots, steps + 1] = next_rnn_states.cpu().numpy()
        self.samples += len(slots)
        self.batches += len(id_rows)

    def _sanitize(self, key: str, array: np.ndarray, rows: np.ndarray, slots: np.ndarray, steps: np.ndarray
                  ) -> np.ndarray:
        """Zero the non-finite values of observation `key` in the batch and in the slots; log each env once."""
        bad = ~np.isfinite(rows)
        self.nonfinite += int(bad.sum())
        rows = np.where(bad, 0, rows)
        bad_rows = bad.reshape(len(rows), -1).any(axis=1)
        array[slots[bad_rows], steps[bad_rows]] = rows[bad_rows]
        agents_per_env = self.layout.num_agents
        for slot in slots[bad_rows].tolist():
            worker = self.layout.worker_of_slot(slot)
            where = np.argwhere(self.control.actors.cur_slot[worker] == slot)
            if not len(where):
                continue
            split, agent = where[0].tolist()
            env = split * (self.layout.agents_per_split // agents_per_env) + agent // agents_per_env
            if (worker, env) not in self.nonfinite_reported:
                self.nonfinite_reported.add((worker, env))
                log.warning("%s: actor %d env %d returned a non-finite observation (field %r); it is set to 0 (further "
                            "ones from this env are only counted)", self.name, worker, env, key)
        return rows

    def _answer(self, requests: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Publish every served request (after all its results are written) and wake the actors that sleep."""
        local, rows, splits = requests
        self.answer_count[local, rows, splits] += 1  # publishes the results: written last
        workers = self.workers[rows]
        for worker in set(workers[self.control.actors.waiting[workers] == 1].tolist()):
            self.actor_inboxes[worker].put(WAKE)
        self.requests += self._streams(requests)

    def report(self) -> None:
        """Send the runner what was served since the last report."""
        self.last_report = time.monotonic()
        versions = ", ".join(str(weights.version) for weights in self.weights if weights is not None)
        self.report_queue.put(InferenceReport(name=self.name, samples=self.samples, batches=self.batches,
                                              timing=self.timing.take(), nonfinite=self.nonfinite,
                                              state=f"weights version {versions}"))
        self.samples = self.batches = self.requests = self.nonfinite = 0


def forward_moving(model: ActorCritic, obs: dict[str, torch.Tensor], rnn_states: torch.Tensor,
                   moving: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`model.forward_step` for these rows; with `moving` (`skip_waiting`) only for the rows whose mask allows an
    action, the waiting ones getting zeros (and their RNN state as it was): half the forward passes of a two-seat
    game."""
    if moving is None or moving.all():
        return model.forward_step(obs, rnn_states)
    index = torch.from_numpy(np.flatnonzero(moving)).to(rnn_states.device)
    params = torch.zeros(len(moving), model.policy_head.out_features, device=rnn_states.device)
    values = torch.zeros(len(moving), device=rnn_states.device)
    if len(index):
        params[index], values[index], _ = model.forward_step({key: x[index] for key, x in obs.items()},
                                                             rnn_states[index])
    return params, values, rnn_states
