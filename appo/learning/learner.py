"""Learner: one per policy. Trajectories in, PPO epochs, weights out.

Each iteration takes `batch_size * num_batches_per_iteration` samples worth of trajectory slots,
drops those older than `--max_policy_lag` versions, copies the rest out of shared memory (and hands the
slots back to their actors at once), computes GAE or V-trace, runs up to `--ppo_epochs` passes of
`--num_batches_per_iteration` minibatches, and publishes the new weights with version + 1. With `--adaptive_epochs`
the passes after the first run only while the next iteration's trajectories are not all in: on a fast env the
learner trains each sample fewer times rather than make the sampler wait, on a slow env it trains all of them.

The parts: which slots are owed and the batch made of them (appo/learning/batching.py), the updates
(appo/learning/ppo.py, with the loss terms in losses.py), the policy's weights, optimizer and hyper-parameters
(policy.py), their publication to inference (weights.py) and checkpoints (checkpoint.py). This module is the
process around them: its main loop, its inbox, PBT's weight exchange and its reports.

Non-finite values never reach the weights: non-finite observations and rewards in a batch become 0
(counted), and an update whose loss or gradient is not finite is skipped (counted); a run of
MAX_CONSECUTIVE_SKIPPED skipped updates stops the run, since the policy can no longer learn.

A learner that dies is replaced by the runner; the replacement continues from the weights published last
(see appo/learning/weights.py), the optimizer state of the newest checkpoint, and every trajectory still owed to it.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import torch
from faster_fifo import Empty

from appo.config.hyperparams import Hyperparams
from appo.config.topology import num_acting_ids, snapshot_ids, trajectories_per_iteration
from appo.config.views import LearnerConfig
from appo.learning.batching import Batch, BatchBuilder, OwedSlots
from appo.learning.checkpoint import checkpoint_dir, latest_intact_checkpoint, load_checkpoint, save_checkpoint
from appo.learning.device import resolve_device
from appo.learning.policy import Policy
from appo.learning.ppo import UPDATE_FIELDS, ppo_updates
from appo.learning.ranks import group_leader, rank_device
from appo.learning.weights import WeightsPublisher, share_snapshots
from appo.memory.segments import check_room
from appo.messages import (
    AdoptWeights,
    CheckpointSaved,
    ExportWeights,
    LearnerIteration,
    LearnerReport,
    SetHyperparams,
    WorkerReady,
)
from appo.population.pbt import transfer_path
from appo.utils.files import atomic_write
from appo.utils.logs import log
from appo.utils.process import FatalError, init_worker
from appo.utils.resources import write_failure
from appo.utils.timing import Timing
from appo.workers.context import WorkerContext
from appo.workers.roles import WorkerRole

MAX_CONSECUTIVE_SKIPPED = 100
INBOX_TIMEOUT_S = 0.05  # the longest a step waits for a message
RESCAN_INTERVAL_S = 1.0
REPORT_INTERVAL_S = 1.0
KL_FIELD = UPDATE_FIELDS.index("iteration_kl")  # where an update's row holds its KL from the iteration's start


class LearnerCounters:
    """What happened since the learner's last report: each update's statistics, trajectories dropped, samples
    trained, updates skipped, inputs that were not finite. Stops the run when updates keep failing."""

    LAG_KEYS = ("lag_min", "lag_max", "lag_avg")

    def __init__(self, policy_id: int, cfg: LearnerConfig):
        self.policy_id, self.cfg = policy_id, cfg
        self.stats: dict[str, list[float]] = defaultdict(list)
        self.samples = self.dropped = self.skipped_updates = self.nonfinite = 0
        self.consecutive_skipped = 0  # kept across reports
        self.failed_saves = 0  # checkpoint writes the disk refused, in this run
        self.last_kl: float | None = None  # the last iteration's mean `iteration_kl` over its applied updates

    def add_batch(self, batch: Batch) -> None:
        self.dropped += batch.dropped
        for key, value in zip(self.LAG_KEYS, batch.lags or ()):
            self.stats[key].append(value)
        self.nonfinite += batch.nonfinite

    def add_update(self, update: dict[str, float]) -> bool:
        """Count an applied update (with its statistics, `UPDATE_FIELDS`) or a skipped one; returns whether it was
        applied."""
        if not update["applied"]:
            self.skipped_updates += 1
            self.consecutive_skipped += 1
            if self.consecutive_skipped >= MAX_CONSECUTIVE_SKIPPED:
                raise FatalError(f"policy {self.policy_id}: the last {self.consecutive_skipped} updates had a "
                                 "non-finite loss or gradient and were skipped; the policy cannot learn (try a lower "
                                 "--learning_rate or --max_grad_norm; the last checkpoint has finite weights)")
            return False
        self.consecutive_skipped = 0
        for key, value in update.items():
            if key != "applied" and not math.isnan(value):  # NaN: not measured in this run (`iteration_kl`)
                self.stats[key].append(value)
        return True

    def add_iteration(self, updates: Iterator[tuple[int, torch.Tensor]], trajectories: int) -> int:
        """Count an iteration's updates (`add_update`) once it has run, its samples and its passes over them (fewer
        than --ppo_epochs with --adaptive_epochs); returns how many updates were applied. The updates' statistics
        are read from the device here, once an iteration."""
        updates = list(updates)
        table = torch.stack([row for _, row in updates]).tolist() if updates else []
        results = [self.add_update(dict(zip(UPDATE_FIELDS, row))) for row in table]
        kls = [row[KL_FIELD] for row, applied in zip(table, results) if applied and not math.isnan(row[KL_FIELD])]
        self.last_kl = float(np.mean(kls)) if kls else None
        self.samples += trajectories * self.cfg.rollout
        self.stats["epochs"].append(updates[-1][0] + 1 if updates else 0.0)  # the last update's pass, counted from 1
        return sum(results)

    def marks(self) -> dict[str, int]:
        """Where the statistics lists end now: `means_since` averages what comes after."""
        return {key: len(values) for key, values in self.stats.items()}

    def means_since(self, marks: dict[str, int]) -> dict[str, float]:
        return {key: float(np.mean(values[marks.get(key, 0):])) for key, values in self.stats.items()
                if len(values) > marks.get(key, 0)}

    def summary(self) -> dict[str, float]:
        """Each statistic over the period: the lag's minimum and maximum, the mean of the rest."""
        reducers = {"lag_min": np.min, "lag_max": np.max}
        return {key: float(reducers.get(key, np.mean)(values)) for key, values in self.stats.items() if values}

    def reset(self) -> None:
        self.stats.clear()
        self.samples = self.dropped = self.skipped_updates = self.nonfinite = 0


def minibatch_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """The learner's own generator for drawing minibatches, so that its draws do not depend on what else runs in the
    process (--serial_mode runs inference there too); seeded (torch's global generator too) or at random."""
    generator = torch.Generator(device)
    if seed is None:
        generator.seed()
    else:
        torch.manual_seed(seed)
        generator.manual_seed(seed)
    return generator


class Learner(WorkerRole):
    """The process side of one policy (module docstring). Owns the policy, its checkpoints and PBT transfer files;
    writes its weights segments and `control.learners` entries (version, env and train steps, pause_collection),
    and clears `control.slot_owed[policy]` once it has read a slot."""

    STEP_TIMEOUT_S = INBOX_TIMEOUT_S

    def __init__(self, ctx: WorkerContext, policy_id: int, hyperparams: dict[str, float] | None = None,
                 report_iterations: bool = False):
        """`hyperparams`: PBT's values for this policy, on top of the flags'; `report_iterations`: send a
        `LearnerIteration` after every iteration (user hooks want them)."""
        flags = Hyperparams.from_cfg(ctx.cfg).updated(hyperparams or {})  # PBT's values live in policy.hyperparams
        ctx = ctx.for_role(LearnerConfig)  # the run's flags this role reads, and no others
        cfg = self.cfg = ctx.cfg
        self.policy_id, self.control, self.exp_dir = policy_id, ctx.control, ctx.exp_dir
        self.learner_inboxes, self.report_queue = ctx.queues.learner_inboxes, ctx.queues.report
        self.inbox, self.report_iterations = self.learner_inboxes[policy_id], report_iterations
        self.device = rank_device(resolve_device(cfg.device), 0, cfg.learner_processes_per_policy)
        self.checkpoint_dir = checkpoint_dir(ctx.exp_dir, policy_id)
        self.shuffle = minibatch_generator(self.device, None if cfg.seed is None else cfg.seed + policy_id)
        self.policy = Policy(policy_id, cfg, ctx.spaces, self.device, flags)
        self.policy.model.set_bf16_images(cfg.learner_bf16)
        checkpoint = self._load()
        check_room(ctx.weights_names, WeightsPublisher.nbytes(self.policy.model))  # the run's, before any is made
        self.weights = WeightsPublisher(self.policy.model, ctx.weights_names[policy_id], ctx.control, policy_id)
        # The self-play pool's segments: snapshot k of this policy is acting id snapshot_ids(cfg, policy_id)[k].
        self.snapshot_weights = [WeightsPublisher(self.policy.model, ctx.weights_names[i], ctx.control, i)
                                 for i in snapshot_ids(cfg, policy_id)]
        share_snapshots(self.policy.snapshots, self.snapshot_weights, ctx.control)
        self.snapshot_announced = False  # the first snapshot this session takes is logged, later ones not
        self.trajs_per_iteration = trajectories_per_iteration(cfg)
        # Pause actors once more than --num_minibatches_to_accumulate minibatches wait beyond the next iteration.
        self.backlog_limit = self.trajs_per_iteration + (
            cfg.num_minibatches_to_accumulate * cfg.batch_size // cfg.rollout)
        self.owed = OwedSlots(ctx, policy_id)
        self.batches = BatchBuilder(cfg, ctx.traj, policy_id, self.device, masked=num_acting_ids(cfg) > 1,
                                    action_masks=self.policy.model.masked)
        self.timing = Timing()
        self.counters = LearnerCounters(policy_id, cfg)
        self.last_scan = self.last_save = self.last_report = time.monotonic()  # of each thing `step` does now and then
        if ctx.control.learners.policy_version[policy_id] >= 0:
            self._continue_predecessor(checkpoint)
        # --learner_processes_per_policy > 1: this is rank 0 of its group (appo/learning/ranks.py)
        self.leader = group_leader(cfg, ctx.control.learners, self.policy, self.device)
        self._take(self.owed.scan())

    # ---------------------------------------------------------------- main loop
    @classmethod
    def main(cls, ctx: WorkerContext, policy_id: int, hyperparams: dict[str, float] | None,
             report_iterations: bool) -> None:
        """The entry point of the learner's process: --learner_torch_threads for torch, then `run()`."""
        init_worker(ctx.cfg, cpu=None, single_thread=True)
        torch.set_num_threads(ctx.cfg.learner_torch_threads)
        cls(ctx, policy_id, hyperparams, report_iterations).run()

    def setup(self) -> None:
        """Serve the weights and say so: a crash from now on gets this learner replaced."""
        self.weights.publish(self.policy.version)
        self.report_queue.put(WorkerReady(f"learner_p{self.policy_id}"))
        self.report()

    def step(self, timeout: float) -> None:
        """Read the inbox, train an iteration if one's worth of trajectories waits, then what is due: a scan for
        slots whose hint was lost, a checkpoint, a report. The read waits (at most `timeout` seconds) only with no
        iteration queued: actors paused for the backlog send nothing, and a wait would leave both sides idle."""
        with self.timing.time("wait"):
            try:
                for message in self.inbox.get_many(block=not self._iteration_ready(), timeout=timeout):
                    self.on_message(message)
            except Empty:
                pass
        self.control.learners.pause_collection[self.policy_id] = len(self.owed) > self.backlog_limit
        if self._iteration_ready():
            self.train_iteration(self.owed.pop(self.trajs_per_iteration))
        now = time.monotonic()
        if now - self.last_scan > RESCAN_INTERVAL_S:
            self._take(self.owed.scan())
            self.last_scan = now
        if now - self.last_save > self.cfg.save_every_sec:
            self.save()
            self.last_save = now
        if now - self.last_report > REPORT_INTERVAL_S:
            self.report()
            self.last_report = now
        if self.leader is not None:
            self.leader.keep_in_step()

    def _iteration_ready(self) -> bool:
        """An iteration is queued, within the env-step budget (past it: wait to be stopped, at a repeatable version)."""
        return len(self.owed) >= self.trajs_per_iteration and self.policy.env_steps < self.cfg.train_for_env_steps

    def close(self) -> None:
        """A last checkpoint and report, when the run stops."""
        self.save()
        if self.counters.failed_saves:
            log.error("policy %d: %d checkpoint writes failed in this run", self.policy_id, self.counters.failed_saves)
        self.report()
        if self.leader is not None:
            self.leader.stop()

    def on_message(self, message: list | SetHyperparams | ExportWeights | AdoptWeights) -> None:
        """From actors: a SlotHint (a list of slots). From the runner (PBT): SetHyperparams, or ExportWeights (hand
        this policy's current state to another learner). From another learner: AdoptWeights (take its state)."""
        match message:
            case list():
                self._take(message)
            case SetHyperparams():
                self.policy.set_hyperparams(message.values)
            case ExportWeights():
                self._export(message.receiver)
            case AdoptWeights():
                self._adopt(message)
            case _:
                raise ValueError(f"learner {self.policy_id}: unknown message {message!r}")

    def _take(self, slots: list[int]) -> None:
        """Queue the slots this learner owes a read and has not queued yet."""
        new = self.owed.unqueued(slots)
        if self.cfg.sampler_only:  # measuring the control: count and recycle at once
            self.policy.env_steps += int(self.batches.own_steps(torch.tensor(new, dtype=torch.long)).sum())
            self.owed.release(new)
            return
        self.owed.queue(new)

    # ---------------------------------------------------------------- training
    def train_iteration(self, slots: list[int]) -> None:
        """Train on the fresh trajectories of `slots` (every slot is handed back) and publish the new weights."""
        policy, counters = self.policy, self.counters
        # With iteration hooks: where this iteration's statistics start (the lists are cleared only by `report`).
        marks = counters.marks() if self.report_iterations else None
        with self.timing.time("batching"):
            batch = self.collect(slots)
        if batch is None:
            return
        policy.apply_learning_rate()  # --lr_schedule: at the env steps counted so far
        next_not_in = (lambda: self.owed.waiting() < self.trajs_per_iteration) if self.cfg.adaptive_epochs else None
        with self.timing.time("sgd"):
            updates = ppo_updates(policy.model, policy.optimizer, self.cfg, policy.hyperparams, batch, self.shuffle,
                                  another_epoch=next_not_in, ranks=self.leader.ranks if self.leader else None)
            policy.train_steps += counters.add_iteration(updates, trajectories=len(batch["dones"]))
            policy.follow_kl(counters.last_kl)
            self._publish()
        if marks is not None:
            self.report_queue.put(LearnerIteration(self.policy_id, policy.version, policy.env_steps,
                                                   counters.means_since(marks)))

    def collect(self, slots: list[int]) -> dict | None:
        """The batch of the slots' fresh enough trajectories (None: all too old); counts this policy's env steps
        and the dropped trajectories, and hands every slot back to its actor."""
        policy = self.policy
        batch = self.batches.build(slots, policy.version, policy.min_version, policy.hyperparams.gamma)
        policy.env_steps += batch.own_steps
        self.counters.add_batch(batch)
        if self.leader is not None:
            self.leader.share_slots(slots)
        self.owed.release(slots)
        return batch.tensors

    def _publish(self) -> None:
        """The weights of a new version to inference (and the self-play pool when due), the counters to the runner."""
        policy, learners = self.policy, self.control.learners
        policy.version += 1
        self.weights.publish(policy.version)
        if policy.snapshot_due():
            place, _ = policy.take_snapshot()
            self.snapshot_weights[place].publish(policy.version)  # the model holds the snapshot's weights now
            if not self.snapshot_announced:  # later ones show in the status line's range of versions
                log.info("policy %d: version %d joins the self-play pool; one joins every %d versions", self.policy_id,
                         policy.version, policy.snapshot_every)
                self.snapshot_announced = True
        learners.env_steps[self.policy_id] = policy.env_steps
        learners.train_steps[self.policy_id] = policy.train_steps

    # ---------------------------------------------------------------- reports and checkpoints
    def report(self) -> None:
        policy, counters = self.policy, self.counters
        stats = counters.summary()
        stats["learning_rate"] = policy.optimizer.param_groups[0]["lr"]
        state = (f"{len(self.owed)} trajectories pending (trains at {self.trajs_per_iteration}), "
                 f"pause={int(self.control.learners.pause_collection[self.policy_id])}")
        self.report_queue.put(LearnerReport(
            self.policy_id, stats, policy.env_steps, policy.version, counters.samples, counters.dropped,
            policy.train_steps, self.timing.take(), counters.skipped_updates, counters.nonfinite, str(self.device),
            state))
        counters.reset()

    def save(self) -> None:
        """A checkpoint, if the disk takes it; a failed write (full, read-only) leaves the older ones intact, is said
        in one line the first time and counted after, and training goes on (the run stops by its budget)."""
        policy = self.policy
        try:
            path = save_checkpoint(self.checkpoint_dir, policy.state_dict(), policy.version, policy.env_steps,
                                   self.cfg.keep_checkpoints)
        except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as a RuntimeError
            self.counters.failed_saves += 1
            if self.counters.failed_saves == 1:
                log.error("policy %d: checkpoint not saved, training goes on (further failures are only counted): %s",
                          self.policy_id, write_failure(self.checkpoint_dir, exc))
            return
        if path is not None:
            self.report_queue.put(CheckpointSaved(self.policy_id, path, policy.version, policy.env_steps))

    def _load(self) -> str | None:
        """Resume from the newest intact checkpoint, if any; returns its path."""
        path = latest_intact_checkpoint(self.checkpoint_dir)
        if path is None:
            return None
        self.policy.load_state_dict(load_checkpoint(path, self.device))
        log.info("policy %d: resumed from %s (version %d, %d env steps)", self.policy_id, path, self.policy.version,
                 self.policy.env_steps)
        return path

    def _continue_predecessor(self, checkpoint: str | None) -> None:
        """This learner replaces one that died: take the weights it published last (newer than any checkpoint)
        and the counters it published, keep the checkpoint's optimizer state, and say what was lost."""
        policy, learners, p = self.policy, self.control.learners, self.policy_id
        published = self.weights.load_published()
        checkpoint_version = policy.version
        policy.version = max(policy.version, int(learners.policy_version[p])) + (published is None)
        policy.env_steps = max(policy.env_steps, int(learners.env_steps[p]))
        policy.train_steps = max(policy.train_steps, int(learners.train_steps[p]))
        weights = (f"the weights it published last (version {published})" if published is not None else
                   "the checkpoint's weights (it died while publishing)" if checkpoint else "fresh weights")
        optimizer = f"from checkpoint version {checkpoint_version}" if checkpoint else "fresh (no checkpoint yet)"
        lost = f"the iteration it was training (up to {self.trajs_per_iteration * self.cfg.rollout} samples)"
        if published != checkpoint_version or not checkpoint:
            lost += " and the optimizer's moments since " + ("that checkpoint" if checkpoint else "the start")
        log.warning("policy %d: learner replaced; continues as version %d from %s; optimizer state %s; lost: %s", p,
                    policy.version, weights, optimizer, lost)

    # ---------------------------------------------------------------- population-based training
    def _export(self, receiver: int) -> None:
        """Write this policy's current weights and optimizer state for another learner (not a checkpoint:
        those may be minutes old), then tell it where they are."""
        path = transfer_path(self.exp_dir, self.policy_id, receiver)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, lambda tmp: torch.save(self.policy.state_dict(), tmp))
        self.learner_inboxes[receiver].put(AdoptWeights(path, self.policy_id, self.policy.version))

    def _adopt(self, message: AdoptWeights) -> None:
        state = load_checkpoint(message.path, self.device)
        os.remove(message.path)
        self.policy.adopt(state)
        if self.leader is not None:
            self.leader.resync = True  # the other ranks take the new state with the next order
        self.weights.publish(self.policy.version)
        self.save()  # a resumed run must not go back to the replaced weights
        log.info("policy %d: took over the weights and optimizer state of policy %d (its version %d) as version %d;"
                 " trajectories of earlier versions are dropped", self.policy_id, message.donor, message.version,
                 self.policy.version)
