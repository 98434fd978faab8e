"""--learner_processes_per_policy=N: N processes (ranks) train one policy together, data-parallel.

Rank 0 is the policy's learner (appo/learning/learner.py, which leads the group through `GroupLeader`, below): it owns
the slots, the version, the weights it publishes, the checkpoints, the reports and PBT's messages. Ranks 1..N-1
(`LearnerRank`, appo/learning/learner_rank.py) follow it through
torch.distributed: gloo on a CPU, NCCL on CUDA with one GPU per rank (rank r on cuda:r). Each iteration rank 0
broadcasts an `Order` (the slots, the policy's counters and hyper-parameters); every rank copies the same
trajectories out of shared memory, so the normalisers' statistics, the bootstrap values and GAE come out the same
everywhere; rank 0 hands the slots back to the actors once every rank has read them. Each minibatch (rank 0 draws
them, and says whether another pass runs) is cut into N shares of trajectories; each rank takes the loss of its share,
weighted by the share's part of the minibatch, and the gradients are summed over the ranks, so every rank takes the
step one process would take over the whole minibatch (tests/test_ranks.py).

The group of policy p meets at --learner_master_addr, port topology.group_port (--learner_master_port + p). A
collective waits at most GROUP_TIMEOUT_S; an idle rank 0 says so every HEARTBEAT_S, so only a lost or stuck rank makes
one time out. A rank that dies or times out takes the group down: the supervisor restarts every rank of the policy
(appo/run/supervisor.py), and the new rank 0 continues from the weights published last, as after a learner's death.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from appo.config.topology import group_port
from appo.learning.policy import Policy
from appo.utils.logs import log

GROUP_TIMEOUT_S = 60.0
HEARTBEAT_S = 5.0


@dataclass
class Order:
    """What rank 0 tells the other ranks: train on `slots`, stay in step (idle), or stop. Before training they take
    the policy's counters and hyper-parameters, and its whole state when `state` holds it (at the group's start and
    after PBT replaced the weights)."""

    kind: str  # "train", "idle" or "stop"
    slots: list[int] = field(default_factory=list)
    version: int = 0
    min_version: int = 0
    env_steps: int = 0
    hyperparams: dict[str, float] = field(default_factory=dict)
    state: bytes | None = None  # Policy.state_dict(), serialised


def rank_device(device: torch.device, rank: int, size: int) -> torch.device:
    """Rank r's device in a group of `size`: its own GPU (cuda:r) on CUDA, the CPU otherwise; a lone learner keeps
    --device as it is."""
    return torch.device("cuda", rank) if device.type == "cuda" and size > 1 else device


def state_bytes(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def state_from_bytes(data: bytes, device: torch.device) -> dict:
    return torch.load(io.BytesIO(data), map_location=device, weights_only=False)


class RankGroup:
    """This process's place in its policy's group of learner ranks, and the collectives they run together."""

    def __init__(self, cfg: Any, policy_id: int, rank: int, device: torch.device):
        self.rank, self.size, self.device = rank, cfg.learner_processes_per_policy, device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"tcp://{cfg.learner_master_addr}:{group_port(cfg, policy_id)}",
                                rank=rank, world_size=self.size, timeout=timedelta(seconds=GROUP_TIMEOUT_S))

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def order(self, order: Order | None = None) -> Order:
        """Rank 0 sends `order`; the others receive and return it."""
        message = [order]
        dist.broadcast_object_list(message, src=0, device=self.device)
        return message[0]

    def barrier(self) -> None:
        """Wait until every rank is here (rank 0 releases slots only after every rank has copied them)."""
        dist.barrier(device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def agree_on_pass(self, go_on: bool, minibatch_order: torch.Tensor | None, n: int) -> tuple[bool, torch.Tensor]:
        """Rank 0's decision whether another pass runs, and its order of the n trajectories for it, on every rank."""
        message = torch.empty(n + 1, dtype=torch.long, device=self.device)
        if self.rank == 0:
            message[0] = int(go_on)
            if go_on:
                message[1:] = minibatch_order
        dist.broadcast(message, src=0)
        return bool(message[0]), message[1:]

    def share(self, n: int) -> slice:
        """This rank's rows of a minibatch of n trajectories: consecutive, as equal as they can be."""
        bounds = [n * r // self.size for r in range(self.size + 1)]
        return slice(bounds[self.rank], bounds[self.rank + 1])

    def sum_gradients(self, model: torch.nn.Module, finite: bool) -> bool:
        """Sum every parameter's gradient over the ranks (a rank whose loss was not finite sends zeros); returns
        whether every rank's loss was finite. Every parameter gets a gradient (zero where none was computed)."""
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if finite and p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([0.0 if finite else 1.0], device=self.device)])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        return bool(flat[-1] == 0)


class GroupLeader:
    """Rank 0's side of the group (the learner holds one when --learner_processes_per_policy > 1): the orders it sends,
    each with the policy's counters and hyper-parameters, and its whole state while the other ranks lack it (at the
    start, after a PBT adoption)."""

    def __init__(self, cfg: Any, policy: Policy, device: torch.device):
        self.ranks = RankGroup(cfg, policy.policy_id, 0, device)
        self.policy, self.resync = policy, True
        log.info("policy %d: %d learner ranks on %s", policy.policy_id, self.ranks.size,
                 f"{self.ranks.size} GPUs" if device.type == "cuda" else
                 f"the CPU ({len(os.sched_getaffinity(0))} cores, shared with the rest of the run)")
        self.order("idle")

    def order(self, kind: str, slots: Sequence[int] = ()) -> None:
        policy = self.policy
        self.ranks.order(Order(kind, list(slots), policy.version, policy.min_version, policy.env_steps,
                               policy.hyperparams.as_dict(), state_bytes(policy.state_dict()) if self.resync else None))
        self.resync, self.last_order = False, time.monotonic()

    def share_slots(self, slots: Sequence[int]) -> None:
        """The other ranks copy these slots too; returns once they have (the slots may then go back to the actors)."""
        self.order("train", slots)
        self.ranks.barrier()

    def keep_in_step(self) -> None:
        """An idle order when none went out for HEARTBEAT_S, so the others' wait never reaches GROUP_TIMEOUT_S."""
        if time.monotonic() - self.last_order > HEARTBEAT_S:
            self.order("idle")

    def stop(self) -> None:
        self.order("stop")
        self.ranks.leave()
