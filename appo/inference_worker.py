"""Inference (policy) worker: one batched forward pass over every pending request of its policy.

A request `("obs", worker, split, t)` says: the env-agents of that split acting for this policy have
their observation at step t of their current slots. The worker gathers all of them, runs the model
once, writes actions, log-probs, values, versions and next RNN states into the same slots, and tells
each actor that its split may step.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
from faster_fifo import Empty

from appo.buffers import Layout, SamplerState, TrajBuffers
from appo.model import ActorCritic
from appo.weights import WeightsSubscriber
from utils.process import init_worker
from utils.timing import Timing

REPORT_INTERVAL_S = 1.0
# A small batch waits at most this long for more requests (see InferenceWorker._next_requests).
MAX_BATCH_WAIT_S = 0.001


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class InferenceWorker:
    def __init__(self, cfg, layout: Layout, spaces, policy_id: int, index: int, traj: TrajBuffers,
                 sampler: SamplerState, request_queue, actor_inboxes: list, report_queue, weights_name: str):
        self.cfg, self.layout, self.policy_id, self.index = cfg, layout, policy_id, index
        self.sampler, self.request_queue = sampler, request_queue
        self.actor_inboxes, self.report_queue = actor_inboxes, report_queue
        self.device = resolve_device(cfg.device)
        self.traj = traj
        self.model = ActorCritic(*spaces, cfg).to(self.device).eval()
        self.weights = WeightsSubscriber(self.model, weights_name, sampler, policy_id)
        self.generator = torch.Generator(self.device)
        if cfg.seed is not None:
            self.generator.manual_seed(cfg.seed + 7919 * (policy_id * cfg.policy_workers_per_policy + index))
        else:
            self.generator.seed()
        self.timing = Timing()
        self.samples = 0
        self.batches = 0
        self.requests = 0
        # Each forward pass has a fixed cost (~0.2 ms of torch dispatch on CPU) whatever its size. With
        # many (worker, split) streams sending requests, batches of one or two requests would spend most
        # of the CPU on that cost, so small batches wait briefly for more: at most MAX_BATCH_WAIT_S, far
        # less than a split's step, so double-buffered actors do not notice.
        streams = cfg.num_workers * cfg.worker_num_splits / cfg.policy_workers_per_policy
        self.min_batch_requests = max(1, int(streams // 8))
        self.request_rate = 0.0  # requests per second, measured over the last report interval

    def run(self) -> None:
        self.weights.update()
        self.report_queue.put(("ready", f"inference_p{self.policy_id}_{self.index}"))
        last_report = time.monotonic()
        while not self.sampler.stop[0]:
            with self.timing.time("wait"):
                requests = self._next_requests()
            if requests:
                with self.timing.time("weights"):
                    self.weights.update()
                with self.timing.time("forward"):
                    self._serve(requests)
            now = time.monotonic()
            if now - last_report > REPORT_INTERVAL_S:
                self.request_rate = self.requests / (now - last_report)
                self._report()
                last_report = now
        self._report()

    def _next_requests(self) -> list:
        """Every pending request; when fewer than min_batch_requests, after a wait for the missing ones."""
        try:
            requests = self.request_queue.get_many(timeout=0.1)
        except Empty:
            return []
        missing = self.min_batch_requests - len(requests)
        if missing > 0 and self.request_rate > 0:
            time.sleep(min(MAX_BATCH_WAIT_S, missing / self.request_rate))
            with contextlib.suppress(Empty):
                requests += self.request_queue.get_many(block=False)
        return requests

    def _locate(self, requests: list) -> tuple[np.ndarray, np.ndarray]:
        """Slot and step index of every env-agent of this policy named by the requests."""
        workers, splits, steps = np.array([request[1:] for request in requests], dtype=np.int64).T
        slots = self.sampler.cur_slot[workers, splits]  # [requests, agents per split]
        steps = np.repeat(steps, slots.shape[1])
        if self.cfg.num_policies == 1:
            return slots.ravel(), steps
        mine = (self.sampler.agent_policy[workers, splits] == self.policy_id).ravel()
        return slots.ravel()[mine], steps[mine]

    @torch.no_grad()
    def _serve(self, requests: list) -> None:
        # Gathers and scatters go through numpy views of the shared memory: for the small index sets of
        # one batch numpy's fancy indexing costs a fraction of torch's. Torch runs only the model.
        slots, steps = self._locate(requests)
        traj, device = self.traj, self.device
        obs = {key: torch.from_numpy(array[slots, steps]).to(device) for key, array in traj.obs.items()}
        rnn_states = torch.from_numpy(traj.rnn_states[slots, steps]).to(device)
        params, values, next_rnn_states = self.model.forward_step(obs, rnn_states)
        dist = self.model.distribution(params)
        actions = dist.sample(self.generator)
        log_probs = dist.log_prob(actions)

        traj.actions[slots, steps] = actions.cpu().numpy()
        traj.log_probs[slots, steps] = log_probs.cpu().numpy()
        traj.values[slots, steps] = values.cpu().numpy()
        traj.policy_versions[slots, steps] = self.weights.version
        if self.cfg.use_rnn:
            traj.rnn_states[slots, steps + 1] = next_rnn_states.cpu().numpy()

        for _, worker, split, _ in requests:
            self.actor_inboxes[worker].put(("act", split))
        self.samples += len(slots)
        self.batches += 1
        self.requests += len(requests)

    def _report(self) -> None:
        self.report_queue.put(("inference", self.policy_id, {
            "samples": self.samples, "batches": self.batches, "timing": self.timing.take(),
            "state": f"weights version {self.weights.version}",
        }))
        self.samples = self.batches = self.requests = 0


def run_inference_worker(cfg, layout, spaces, policy_id, index, traj, sampler, request_queue, actor_inboxes,
                         report_queue, weights_name) -> None:
    init_worker(cfg, cpu=None, single_thread=True)
    torch.set_num_threads(1)
    InferenceWorker(cfg, layout, spaces, policy_id, index, traj, sampler, request_queue, actor_inboxes,
                    report_queue, weights_name).run()
