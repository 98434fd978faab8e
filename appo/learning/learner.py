"""Learner: one per policy. Trajectories in, PPO epochs, weights out.

Each iteration takes `batch_size * num_batches_per_iteration` samples worth of trajectory slots,
drops those older than `--max_policy_lag` versions, copies the rest out of shared memory (and hands the
slots back to their actors at once), computes GAE or V-trace, runs `--ppo_epochs` passes of
`--num_batches_per_iteration` minibatches, and publishes the new weights with version + 1.

Non-finite values never reach the weights: non-finite observations and rewards in a batch become 0
(counted), and an update whose loss or gradient is not finite is skipped (counted); a run of
MAX_CONSECUTIVE_SKIPPED skipped updates stops the run, since the policy can no longer learn.

A learner that dies is replaced by the runner; the replacement continues from the weights published last
(see appo/learning/weights.py), the optimizer state of the newest checkpoint, and every trajectory still owed to it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict

import numpy as np
import torch
from faster_fifo import Empty, Full
from torch import Tensor

from appo.config.topology import trajectories_per_iteration
from appo.learning import losses
from appo.learning.checkpoint import checkpoint_dir, latest_intact_checkpoint, load_checkpoint, save_checkpoint
from appo.learning.device import resolve_device
from appo.learning.model import ActorCritic
from appo.learning.policy import Policy
from appo.learning.weights import WeightsPublisher
from appo.memory.buffers import TRUNCATED, Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.population.matchmaking import num_acting_ids, snapshot_ids
from appo.population.pbt import pbt_dir
from utils.logs import log
from utils.process import FatalError, init_worker
from utils.timing import Timing

MAX_CONSECUTIVE_SKIPPED = 100
RESCAN_INTERVAL_S = 1.0


def select(x: Tensor | dict[str, Tensor], index: Tensor, device: torch.device | None = None
           ) -> Tensor | dict[str, Tensor]:
    """Rows `index` of a tensor, or of every tensor of an observation dict (optionally moved to device)."""
    if isinstance(x, dict):
        return {key: select(value, index, device) for key, value in x.items()}
    rows = x[index]
    return rows if device is None else rows.to(device)


def train_step(model: ActorCritic, optimizer: torch.optim.Optimizer, cfg, mb: dict[str, Tensor],
               advantages: Tensor | None, targets: Tensor | None) -> dict[str, float] | None:
    """One minibatch of APPO: forward, losses, backward, clipped Adam step. Returns statistics, or None when
    the loss or the gradient is not finite: then nothing changes (weights, optimizer, return statistics).

    `mb` holds whole trajectories [n, T]; `values` are the behaviour values stored by inference (the
    old values of PPO's value clipping) and `bootstrap` the value after the last step. With GAE the
    advantages and targets are precomputed; with V-trace they are computed here from the current
    policy's log-probabilities. Values are in reward units throughout; the value loss alone is taken in
    the value head's units, which differ under --normalize_returns.
    """
    params, values = forward_trajectories(model, cfg, mb)
    dist = model.distribution(params)
    log_probs = dist.log_prob(mb["actions"])
    ratio = torch.exp(log_probs - mb["log_probs"])
    mask = mb.get("mask")
    if cfg.with_vtrace:
        targets, advantages = losses.vtrace(
            mb["log_probs"], log_probs.detach(), mb["rewards"], mb["dones"], values.detach(), mb["bootstrap"],
            cfg.gamma, cfg.vtrace_rho, cfg.vtrace_c)
    if cfg.normalize_advantage:
        advantages = losses.normalize(advantages, mask)

    policy_loss = losses.ppo_policy_loss(ratio, advantages, cfg.ppo_clip_ratio, mask)
    norm = model.normalize_values
    value_loss = losses.clipped_value_loss(norm(values), norm(mb["values"]), norm(targets), cfg.ppo_clip_value, mask)
    entropy = losses.masked_mean(dist.entropy(), mask)
    if cfg.exploration_loss == "entropy":
        exploration_loss = -entropy
    else:
        exploration_loss = losses.masked_mean(dist.symmetric_kl_to_prior(), mask)
    loss = policy_loss + cfg.value_loss_coeff * value_loss + cfg.exploration_loss_coeff * exploration_loss

    optimizer.zero_grad(set_to_none=True)
    if not torch.isfinite(loss):
        return None
    loss.backward()
    if cfg.max_grad_norm > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    else:
        grad_norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None))
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    model.update_return_stats(targets if mask is None else targets[mask > 0])  # used from the next step on

    with torch.no_grad():
        low, high = 1.0 / (1.0 + cfg.ppo_clip_ratio), 1.0 + cfg.ppo_clip_ratio
        return {
            "loss": loss.item(),
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "exploration_loss": exploration_loss.item(),
            "entropy": entropy.item(),
            "kl": losses.masked_mean(mb["log_probs"] - log_probs, mask).item(),
            "clip_fraction": losses.masked_mean(((ratio < low) | (ratio > high)).float(), mask).item(),
            "grad_norm": float(grad_norm),
            "values": losses.masked_mean(values, mask).item(),
            "value_targets": losses.masked_mean(targets, mask).item(),
        }


def replace_nonfinite_(batch: dict[str, Tensor]) -> int:
    """Set non-finite observations (float keys) and rewards of a batch to 0 in place; returns how many."""
    count = 0
    for tensor in [*batch["obs"].values(), batch["rewards"]]:
        if tensor.is_floating_point():
            bad = ~torch.isfinite(tensor)
            n = int(bad.sum())
            if n:
                tensor[bad] = 0.0
                count += n
    return count


def forward_trajectories(model: ActorCritic, cfg, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Action params [n, T, ...] and values [n, T] of whole trajectories, cut into --recurrence chunks.

    Each chunk starts from the RNN state the actor recorded at that step, so back-propagation runs
    over at most `recurrence` steps; episode ends inside a chunk reset the state as during collection.
    """
    dones = batch["dones"]
    n, length = dones.shape
    r = cfg.recurrence
    chunks = n * length // r
    params, values = model.forward_sequence(
        {key: obs[:, :-1].reshape(chunks, r, *obs.shape[2:]) for key, obs in batch["obs"].items()},
        batch["rnn_states"][:, :-1:r].reshape(chunks, -1),
        dones.reshape(chunks, r),
    )
    return params.reshape(n, length, -1), values.reshape(n, length)


@torch.no_grad()
def bootstrap_values(model: ActorCritic, batch: dict[str, Tensor]) -> Tensor:
    """Value [n] of the observation after each trajectory's last step, under the current weights.

    Every other step already has its value from inference (the behaviour value, which is what PPO's
    GAE and value clipping use), so only these 1/T of the observations need a forward pass here.
    """
    last_obs = {key: obs[:, -1:] for key, obs in batch["obs"].items()}
    no_done = torch.zeros_like(batch["dones"][:, :1])
    _, bootstrap = model.forward_sequence(last_obs, batch["rnn_states"][:, -1], no_done)
    return bootstrap[:, 0]


class Learner:
    """The process side of one policy: collects trajectories, calls the PPO update, publishes weights, and
    carries out what population-based training asks of it (see `_on_message`)."""

    def __init__(self, cfg, layout: Layout, spaces, policy_id: int, traj: TrajBuffers, control: SharedControl,
                 inboxes: list, actor_inboxes: list, report_queue, weights_names: list[str], exp_dir: str,
                 hyperparams: dict[str, float] | None = None, report_iterations: bool = False):
        """`weights_names[id]`: the weights segment of every acting id (this policy's and its snapshots' are used)."""
        self.cfg, self.layout, self.policy_id = cfg, layout, policy_id
        self.control, self.inbox, self.learner_inboxes = control, inboxes[policy_id], inboxes
        self.actor_inboxes, self.report_queue = actor_inboxes, report_queue
        self.exp_dir = exp_dir
        self.report_iterations = report_iterations  # an "iteration" report per iteration (user hooks want them)
        self.device = resolve_device(cfg.device)
        self.traj = traj.torch_views()
        self.checkpoint_dir = checkpoint_dir(exp_dir, policy_id)
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed + policy_id)
        self.policy = Policy(policy_id, cfg, spaces, self.device, hyperparams)
        self.policy.model.set_bf16_images(cfg.learner_bf16)
        checkpoint = self._load()
        self.weights = WeightsPublisher(self.policy.model, weights_names[policy_id], control, policy_id)
        # The self-play pool's segments: snapshot k of this policy is acting id snapshot_ids(cfg, policy_id)[k].
        self.snapshot_weights = [WeightsPublisher(self.policy.model, weights_names[i], control, i)
                                 for i in snapshot_ids(cfg, policy_id)]
        self._share_snapshots()
        self.trajs_per_iteration = trajectories_per_iteration(cfg)
        # Slots owed by this learner, oldest first: found by the actors' messages or by a scan of slot_owed.
        self.pending: list[int] = []
        self.pending_set: set[int] = set()
        self.timing = Timing()
        self.stats: dict[str, list[float]] = defaultdict(list)
        self.dropped = 0
        self.samples = 0
        self.skipped_updates = 0  # non-finite loss or gradient, since the last report
        self.consecutive_skipped = 0
        self.nonfinite_inputs = 0
        if control.learners.policy_version[policy_id] >= 0:
            self._continue_predecessor(checkpoint)
        self._take_owed_slots()

    def _continue_predecessor(self, checkpoint: str | None) -> None:
        """This learner replaces one that died: take the weights it published last (newer than any checkpoint)
        and the counters it published, keep the checkpoint's optimizer state, and say what was lost."""
        policy, control, p = self.policy, self.control, self.policy_id
        published = self.weights.load_published()
        checkpoint_version = policy.version
        policy.version = max(policy.version, int(control.learners.policy_version[p])) + (published is None)
        policy.env_steps = max(policy.env_steps, int(control.learners.env_steps[p]))
        policy.train_steps = max(policy.train_steps, int(control.learners.train_steps[p]))
        weights = (f"the weights it published last (version {published})" if published is not None else
                   "the checkpoint's weights (it died while publishing)" if checkpoint else "fresh weights")
        optimizer = f"from checkpoint version {checkpoint_version}" if checkpoint else "fresh (no checkpoint yet)"
        lost = f"the iteration it was training (up to {self.trajs_per_iteration * self.cfg.rollout} samples)"
        if published != checkpoint_version or not checkpoint:
            lost += " and the optimizer's moments since " + ("that checkpoint" if checkpoint else "the start")
        log.warning("policy %d: learner replaced; continues as version %d from %s; optimizer state %s; lost: %s", p,
                    policy.version, weights, optimizer, lost)

    # ---------------------------------------------------------------- self-play pool
    def _share_snapshots(self) -> None:
        """Make the pool in shared memory and the policy's agree: snapshots a predecessor of this learner published
        are newer than the checkpoint's and are taken back; otherwise the checkpoint's are published."""
        for k, publisher in enumerate(self.snapshot_weights):
            published = publisher.read_frozen()
            if published is not None:
                version = int(self.control.learners.policy_version[publisher.policy_id])
                self.policy.snapshots[k] = {"version": version, "weights": published}
            elif self.policy.snapshots[k] is not None:
                publisher.publish_frozen(self.policy.snapshots[k]["weights"], self.policy.snapshots[k]["version"])

    def _take_snapshot(self) -> None:
        place, replaced = self.policy.take_snapshot()
        self.snapshot_weights[place].publish(self.policy.version)  # the model holds the snapshot's weights now
        log.info("policy %d: version %d joins the self-play pool%s", self.policy_id, self.policy.version,
                 "" if replaced is None else f" in place of version {replaced}")

    # ---------------------------------------------------------------- checkpoints
    def _load(self) -> str | None:
        """Resume from the newest intact checkpoint, if any; returns its path."""
        path = latest_intact_checkpoint(self.checkpoint_dir)
        if path is None:
            return None
        self.policy.load_state_dict(load_checkpoint(path, self.device))
        log.info("policy %d: resumed from %s (version %d, %d env steps)", self.policy_id, path, self.policy.version,
                 self.policy.env_steps)
        return path

    def save(self) -> None:
        policy = self.policy
        path = save_checkpoint(self.checkpoint_dir, policy.state_dict(), policy.version, policy.env_steps,
                               self.cfg.keep_checkpoints)
        if path is not None:
            self.report_queue.put(("checkpoint", self.policy_id, {"path": path, "version": policy.version,
                                                                  "env_steps": policy.env_steps}))

    # ---------------------------------------------------------------- main loop
    def run(self) -> None:
        self.weights.publish(self.policy.version)
        self.report_queue.put(("ready", f"learner_p{self.policy_id}"))  # a crash from now on gets it replaced
        self._report()
        last_save = last_report = last_scan = time.monotonic()
        # Pause actors once more than --num_minibatches_to_accumulate minibatches wait beyond the next iteration.
        backlog_limit = self.trajs_per_iteration + (
            self.cfg.num_minibatches_to_accumulate * self.cfg.batch_size // self.cfg.rollout)
        while not self.control.runner.stop[0]:
            with self.timing.time("wait"):
                try:
                    for message in self.inbox.get_many(timeout=0.05):
                        self._on_message(message)
                except Empty:
                    pass
            self.control.learners.pause_collection[self.policy_id] = len(self.pending) > backlog_limit
            # Past the env-step budget it only waits to be stopped, so a run ends at a repeatable version.
            if (len(self.pending) >= self.trajs_per_iteration
                    and self.policy.env_steps < self.cfg.train_for_env_steps):
                slots = self.pending[:self.trajs_per_iteration]
                del self.pending[:self.trajs_per_iteration]
                self.pending_set.difference_update(slots)
                self.train_iteration(slots)
            now = time.monotonic()
            if now - last_scan > RESCAN_INTERVAL_S:  # slots whose message was lost (a sender died, a full queue)
                self._take_owed_slots()
                last_scan = now
            if now - last_save > self.cfg.save_every_sec:
                self.save()
                last_save = now
            if now - last_report > 1.0:
                self._report()
                last_report = now
        self.save()
        self._report()

    def _on_message(self, message: tuple) -> None:
        """The inbox carries, from actors: ("traj", slots); from the runner (PBT): ("hyperparams", values),
        ("export", receiver): hand this policy's current state to learner `receiver`; and from another
        learner: ("adopt", path, donor, donor_version): take over the state that donor wrote to path."""
        kind = message[0]
        if kind == "traj":
            self._take(message[1])
        elif kind == "hyperparams":
            self.policy.set_hyperparams(message[1])
        elif kind == "export":
            self._export(message[1])
        elif kind == "adopt":
            self._adopt(*message[1:])
        else:
            raise ValueError(f"learner {self.policy_id}: unknown message {kind!r}")

    def _take(self, slots: list[int]) -> None:
        """Queue the slots this learner owes a read and has not queued yet (a message may repeat what a scan
        found, or name a slot already read)."""
        owed = self.control.slot_owed[self.policy_id]
        new = [slot for slot in slots if owed[slot] and slot not in self.pending_set]
        if self.cfg.sampler_only:  # measuring the control: count and recycle at once
            self._count_env_steps(torch.tensor(new, dtype=torch.long))
            self._release(new)
            return
        self.pending.extend(new)
        self.pending_set.update(new)

    def _take_owed_slots(self) -> None:
        # A copy: actors set flags meanwhile, and numpy's nonzero fails if the count changes while it runs.
        self._take(np.flatnonzero(self.control.slot_owed[self.policy_id].copy()).tolist())

    # ---------------------------------------------------------------- population-based training
    def _export(self, receiver: int) -> None:
        """Write this policy's current weights and optimizer state for another learner (not a checkpoint:
        those may be minutes old), then tell it where they are."""
        path = os.path.join(pbt_dir(self.exp_dir), f"transfer_p{self.policy_id}_to_p{receiver}.pth")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(self.policy.state_dict(), f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
        self.learner_inboxes[receiver].put(("adopt", path, self.policy_id, self.policy.version))

    def _adopt(self, path: str, donor: int, donor_version: int) -> None:
        state = torch.load(path, map_location=self.device, weights_only=False)
        os.remove(path)
        self.policy.adopt(state)
        self.weights.publish(self.policy.version)
        self.save()  # a resumed run must not go back to the replaced weights
        log.info("policy %d: took over the weights and optimizer state of policy %d (its version %d) as version %d;"
                 " trajectories of earlier versions are dropped", self.policy_id, donor, donor_version,
                 self.policy.version)

    # ---------------------------------------------------------------- training
    def _collect(self, slots: list[int]) -> dict[str, Tensor] | None:
        """Copy fresh enough trajectories out of shared memory and return every slot to its actor.

        Too old means: a step more than --max_policy_lag versions behind, or sampled by weights this policy
        has since replaced (PBT)."""
        index = torch.tensor(slots, dtype=torch.long)
        traj, cfg, version = self.traj, self.policy.cfg, self.policy.version
        valid = self._count_env_steps(index)
        versions = traj["policy_versions"][index]
        oldest = torch.where(valid, versions, torch.full_like(versions, version)).min(dim=1).values
        fresh = ((version - oldest) <= cfg.max_policy_lag) & (oldest >= self.policy.min_version)
        self.dropped += int((~fresh).sum())
        keep = index[fresh]
        batch = None
        if len(keep) > 0:
            lags = (version - versions[fresh])[valid[fresh]].float()
            self.stats["lag_min"].append(lags.min().item())
            self.stats["lag_max"].append(lags.max().item())
            self.stats["lag_avg"].append(lags.mean().item())
            batch = {name: select(traj[name], keep, self.device) for name in
                     ("obs", "rnn_states", "actions", "log_probs", "values", "rewards", "dones")}
            done_codes = batch["dones"]
            batch["rewards"] = losses.shaped_rewards(batch["rewards"], (done_codes == TRUNCATED).float(),
                                                     batch["values"], cfg.gamma, cfg.reward_scale, cfg.reward_clip,
                                                     cfg.value_bootstrap)
            batch["dones"] = (done_codes > 0).float()
            self.nonfinite_inputs += replace_nonfinite_(batch)
            if num_acting_ids(cfg) > 1:  # only this policy's steps are learned from (not other policies', snapshots')
                batch["mask"] = valid[fresh].float().to(self.device)
        self._release(slots)
        return batch

    def _count_env_steps(self, index: Tensor) -> Tensor:
        """Count the steps this policy took in these slots; returns their mask [n, T]."""
        valid = self.traj["policy_ids"][index] == self.policy_id
        self.policy.env_steps += int(valid.sum())
        return valid

    def _release(self, slots: list[int]) -> None:
        """This learner has read the slots: clear what it owes and wake their actors (they may wait for slots)."""
        if not slots:
            return
        self.control.slot_owed[self.policy_id, slots] = 0
        for worker in {self.layout.worker_of_slot(slot) for slot in slots}:
            with contextlib.suppress(Full):
                self.actor_inboxes[worker].put_nowait(("released",))

    def train_iteration(self, slots: list[int]) -> None:
        policy = self.policy
        cfg, model = policy.cfg, policy.model
        # With iteration hooks: where this iteration's values start in the stats lists (cleared only by _report).
        marks = {key: len(values) for key, values in self.stats.items()} if self.report_iterations else None
        with self.timing.time("batching"):
            batch = self._collect(slots)
        if batch is None:
            return
        with self.timing.time("sgd"):
            model.update_obs_stats({key: obs[:, :-1] for key, obs in batch["obs"].items()})
            batch["bootstrap"] = bootstrap_values(model, batch)
            advantages = targets = None
            if not cfg.with_vtrace:
                advantages, targets = losses.gae(batch["rewards"], batch["dones"], batch["values"], batch["bootstrap"],
                                                 cfg.gamma, cfg.gae_lambda)
            n = batch["rewards"].shape[0]
            num_minibatches = min(cfg.num_batches_per_iteration, n)
            for _ in range(cfg.ppo_epochs):
                for mb_index in torch.randperm(n, device=self.device).chunk(num_minibatches):
                    mb = {name: select(tensor, mb_index) for name, tensor in batch.items()}
                    step_stats = train_step(
                        model, policy.optimizer, cfg, mb,
                        None if advantages is None else advantages[mb_index],
                        None if targets is None else targets[mb_index])
                    self._count_update(step_stats is not None)
                    for key, value in (step_stats or {}).items():
                        self.stats[key].append(value)
            self.samples += n * cfg.rollout
            policy.version += 1
            self.weights.publish(policy.version)
            if policy.snapshot_due():
                self._take_snapshot()
            self.control.learners.env_steps[self.policy_id] = policy.env_steps
            self.control.learners.train_steps[self.policy_id] = policy.train_steps
        if marks is not None:  # this iteration's values are the ones after the marks
            stats = {key: float(np.mean(values[marks.get(key, 0):])) for key, values in self.stats.items()
                     if len(values) > marks.get(key, 0)}
            self.report_queue.put(("iteration", self.policy_id, {
                "version": policy.version, "env_steps": policy.env_steps, "stats": stats}))

    def _count_update(self, applied: bool) -> None:
        """Count applied and skipped (non-finite) updates; stop the run when updates keep failing."""
        if applied:
            self.policy.train_steps += 1
            self.consecutive_skipped = 0
            return
        self.skipped_updates += 1
        self.consecutive_skipped += 1
        if self.consecutive_skipped >= MAX_CONSECUTIVE_SKIPPED:
            raise FatalError(f"policy {self.policy_id}: the last {self.consecutive_skipped} updates had a non-finite "
                             "loss or gradient and were skipped; the policy cannot learn (try a lower "
                             "--learning_rate or --max_grad_norm; the last checkpoint has finite weights)")

    def _report(self) -> None:
        reducers = {"lag_min": np.min, "lag_max": np.max}
        stats = {key: float(reducers.get(key, np.mean)(values)) for key, values in self.stats.items() if values}
        policy = self.policy
        stats["learning_rate"] = policy.optimizer.param_groups[0]["lr"]
        self.report_queue.put(("learner", self.policy_id, {
            "stats": stats, "env_steps": policy.env_steps, "version": policy.version, "samples": self.samples,
            "dropped": self.dropped, "train_steps": policy.train_steps, "timing": self.timing.take(),
            "skipped_updates": self.skipped_updates, "nonfinite_inputs": self.nonfinite_inputs,
            "device": str(self.device),
            "state": f"{len(self.pending)} trajectories pending (trains at {self.trajs_per_iteration}), "
                     f"pause={int(self.control.learners.pause_collection[self.policy_id])}",
        }))
        self.stats.clear()
        self.samples = self.dropped = self.skipped_updates = self.nonfinite_inputs = 0


def run_learner(cfg, layout, spaces, policy_id, traj, control, inboxes, actor_inboxes, report_queue, weights_names,
                exp_dir, hyperparams, report_iterations) -> None:
    init_worker(cfg, cpu=None, single_thread=True)
    torch.set_num_threads(cfg.learner_torch_threads)
    Learner(cfg, layout, spaces, policy_id, traj, control, inboxes, actor_inboxes, report_queue, weights_names,
            exp_dir, hyperparams, report_iterations).run()
