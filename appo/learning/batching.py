"""From trajectory slots to a training batch: which slots a learner owes a read, and copying them out.

`OwedSlots` keeps the slots that hold finished trajectories for one learner, oldest first, and hands them back to
their actors (appo/memory/slots.py). `BatchBuilder` copies the fresh enough ones out of shared memory into a batch
on the learner's device (the layout of a batch is in appo/learning/ppo.py), through `DeviceCopies`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from appo.config.views import LearnerConfig
from appo.learning import losses
from appo.learning.ppo import replace_nonfinite_
from appo.memory.buffers import TRUNCATED, TrajBuffers
from appo.memory.slots import release_slots
from appo.spaces import MASK_KEY
from appo.workers.context import WorkerContext


class OwedSlots:
    """The slots one policy's learner owes a read (`control.slot_owed[policy]`), in the order it heard of them.

    Actors hint at new slots through the learner's inbox; a scan of the flags finds those whose hint was lost (a
    sender died, a full queue). Writes `control.slot_owed[policy]` (cleared on release) and wakes actors."""

    def __init__(self, ctx: WorkerContext, policy_id: int):
        self.control, self.layout, self.policy_id = ctx.control, ctx.layout, policy_id
        self.actor_inboxes = ctx.queues.actor_inboxes
        self.pending: list[int] = []  # oldest first
        self.pending_set: set[int] = set()

    def __len__(self) -> int:
        return len(self.pending)

    def unqueued(self, slots: list[int]) -> list[int]:
        """The slots still owed and not queued yet (a hint may repeat what a scan found, or name a slot read)."""
        owed = self.control.slot_owed[self.policy_id]
        return [slot for slot in slots if owed[slot] and slot not in self.pending_set]

    def scan(self) -> list[int]:
        """Every slot the flags say is owed (queued or not)."""
        # A copy: actors set flags meanwhile, and numpy's nonzero fails if the count changes while it runs.
        return np.flatnonzero(self.control.slot_owed[self.policy_id].copy()).tolist()

    def waiting(self) -> int:
        """How many slots hold a trajectory this learner has not read yet (queued or not)."""
        return int(np.count_nonzero(self.control.slot_owed[self.policy_id]))

    def queue(self, slots: list[int]) -> None:
        self.pending.extend(slots)
        self.pending_set.update(slots)

    def pop(self, count: int) -> list[int]:
        """The oldest `count` slots, no longer queued (they stay owed until `release`)."""
        slots = self.pending[:count]
        del self.pending[:count]
        self.pending_set.difference_update(slots)
        return slots

    def release(self, slots: list[int]) -> None:
        """The learner has read the slots: they are free for their actors again."""
        release_slots(self.control, self.layout, self.actor_inboxes, self.policy_id, slots)


class DeviceCopies:
    """Rows of the trajectory buffers copied to the learner's device.

    On a GPU the rows of each field are gathered into a page-locked ("pinned") host buffer of that field, kept from
    batch to batch, and copied without waiting (`non_blocking`): a copy from pageable memory goes through the
    driver's own staging and holds the learner until it is done, one from pinned memory runs by DMA while the learner
    goes on. A buffer is refilled only once the copies out of it have finished (`wait`, on an event recorded after
    them). On a CPU the rows are indexed out of the buffers, and `staged` is False."""

    def __init__(self, device: torch.device, staged: bool | None = None):
        """`staged` (default: on CUDA) gathers through the kept host buffers, pinned on CUDA."""
        self.device = device
        self.staged = device.type == "cuda" if staged is None else staged
        self.buffers: dict[str, Tensor] = {}
        self.copied: Any = None  # a torch.cuda.Event after the last batch's copies

    def rows(self, name: str, x: Tensor | dict[str, Tensor], index: Tensor) -> Tensor | dict[str, Tensor]:
        """Rows `index` of `x` (a tensor, or an observation dict) on the device."""
        if isinstance(x, dict):
            return {key: self.rows(f"{name}/{key}", value, index) for key, value in x.items()}
        if not self.staged:
            return x[index].to(self.device)
        buffer = self.buffers.get(name)
        if buffer is None or len(buffer) < len(index) or buffer.shape[1:] != x.shape[1:]:
            buffer = torch.empty((len(index), *x.shape[1:]), dtype=x.dtype, pin_memory=self.device.type == "cuda")
            self.buffers[name] = buffer
        gathered = torch.index_select(x, 0, index, out=buffer[:len(index)])
        return gathered.to(self.device, non_blocking=True)

    def wait(self) -> None:
        """Until the last batch's copies are done: its buffers may be refilled."""
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None

    def sent(self) -> None:
        """The batch's copies are queued: mark where they end."""
        if self.staged and self.device.type == "cuda":
            self.copied = torch.cuda.Event()
            self.copied.record()


@dataclass
class Batch:
    """What `BatchBuilder.build` made of some slots."""

    tensors: dict[str, Any] | None  # None: every trajectory was too old
    own_steps: int  # env steps this policy took in the slots (fresh or not)
    dropped: int  # trajectories too old to learn from
    lags: tuple[float, float, float] | None  # min, max and mean policy lag of the steps kept, in versions
    nonfinite: int  # observation and reward values that were not finite, set to 0


class BatchBuilder:
    """Copies trajectories of one policy out of the trajectory buffers (read only) onto the learner's device."""

    FIELDS = ("obs", "rnn_states", "actions", "log_probs", "values", "rewards", "dones")

    def __init__(self, cfg: LearnerConfig, traj: TrajBuffers, policy_id: int, device: torch.device, masked: bool,
                 action_masks: bool = False):
        """`masked`: other acting ids (policies, self-play snapshots) also fill slots, so a batch carries a mask of
        this policy's steps. `action_masks`: the model masks actions, and a step whose mask allows nothing was a seat
        waiting for its turn (appo/envs/pettingzoo_turns.py), which trains nothing itself."""
        self.cfg, self.policy_id, self.device, self.masked = cfg, policy_id, device, masked
        self.traj = traj.torch_views()
        self.copies = DeviceCopies(device)
        self.action_masks = action_masks

    def own_steps(self, index: Tensor) -> Tensor:
        """Which steps [n, T] of these slots this policy took."""
        return self.traj["policy_ids"][index] == self.policy_id

    def acting(self, index: Tensor) -> Tensor | None:
        """Where [n, T+1] the seats of these slots were to act (their action mask allowed something), column T the
        observation after the last step; None without masks."""
        if not self.action_masks:
            return None
        return (self.traj["obs"][MASK_KEY][index] > 0).any(dim=-1)

    def build(self, slots: list[int], version: int, min_version: int, gamma: float) -> Batch:
        """A batch of the slots' fresh enough trajectories; too old means a step more than --max_policy_lag
        versions behind `version`, or sampled by weights older than `min_version` (replaced since, by PBT)."""
        index = torch.tensor(slots, dtype=torch.long)
        traj, cfg = self.traj, self.cfg
        valid, acting = self.own_steps(index), self.acting(index)
        acted = None if acting is None else acting[:, :-1]
        versions = traj["policy_versions"][index]
        oldest = torch.where(valid, versions, torch.full_like(versions, version)).min(dim=1).values
        fresh = ((version - oldest) <= cfg.max_policy_lag) & (oldest >= min_version)
        # A seat that waited for its turn made no sample: the env steps counted are the moves made.
        result = Batch(None, int(valid.sum() if acted is None else (valid & acted).sum()), int((~fresh).sum()), None, 0)
        keep = index[fresh]
        if len(keep) == 0:
            return result
        lags = (version - versions[fresh])[valid[fresh]].float()
        result.lags = (lags.min().item(), lags.max().item(), lags.mean().item())
        self.copies.wait()
        batch = {name: self.copies.rows(name, traj[name], keep) for name in self.FIELDS}
        self.copies.sent()
        done_codes = batch["dones"]
        truncated = (done_codes == TRUNCATED).float()
        batch["rewards"] = losses.shaped_rewards(batch["rewards"], truncated, batch["values"],
                                                 gamma, cfg.reward_scale, cfg.reward_clip, cfg.value_bootstrap)
        batch["dones"] = (done_codes > 0).float()
        result.nonfinite = replace_nonfinite_(batch)
        if self.masked:  # only this policy's steps are learned from (not other policies', snapshots')
            batch["mask"] = valid[fresh].float().to(self.device)
        if acted is not None:  # and only the steps that acted train (`ppo_updates` passes the waiting ones through)
            batch["policy_mask"] = (valid & acted)[fresh].float().to(self.device)
            batch["acting"] = acting[fresh].float().to(self.device)
            batch["truncated"] = truncated
        result.tensors = batch
        return result
