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
step one process would take over the whole minibatch (tests/test_ranks.py). The minibatch's statistics (losses,
entropy, KL) travel in the same all-reduce, weighted alike: rank 0 reports the whole minibatch's, even when its own
share is empty. Every WEIGHTS_CHECK_EVERY iterations the ranks compare a checksum of their weights and normalisers
(identical by construction, as long as every rank computes bit for bit alike); if they differ, rank 0 says so in one
line and sends its whole state to the others with the next order.

Rank 0 of policy p listens at --learner_master_addr on the port topology.group_port gives: by default a free one the
system picks when the group starts (two runs at once never meet on one port), else --learner_master_port + p. It
publishes a picked port in the run's shared memory (`control.learners.group_port`: every rank of a policy runs on the
runner's host), where the other ranks wait for it; the group's death clears it (appo/run/roles.py) before any new
member starts, so a new rank never joins a dead group's port, nor one that another run took since. A collective waits
at most GROUP_TIMEOUT_S; an idle rank 0 says so every HEARTBEAT_S, so only a lost or stuck rank makes one time out. A
rank that dies or times out takes the group down: the others' collectives fail, which each reports as a `LostPeer`,
so the supervisor blames the rank that died first, restarts every rank of the policy (appo/run/supervisor.py), and
the new rank 0 continues from the weights published last, as after a learner's death.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from appo.config.topology import group_port
from appo.learning.policy import Policy
from appo.memory.control import LearnerArrays
from appo.utils.logs import log
from appo.utils.process import LostPeer

GROUP_TIMEOUT_S = 60.0
HEARTBEAT_S = 5.0
PORT_POLL_S = 0.01  # how often a rank looks for the port of its rank 0
WEIGHTS_CHECK_EVERY = 100  # iterations between two comparisons of the ranks' weights


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
    check_weights: bool = False  # before this training, compare the ranks' weights (`RankGroup.checksums`)
    lr_factor: float = 1.0  # the policy's, kept by rank 0 (--lr_schedule=kl_adaptive)


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


def first_sentence(error: str) -> str:
    """The gist of a torch.distributed error: its first sentence, without gloo's [source:line] in front."""
    line = re.sub(r"^\[[^\]]*\]\s*", "", error.strip().split("\n")[0])
    return line.split(". ")[0]


def weights_checksum(model: torch.nn.Module) -> float:
    """The float64 sum of every parameter and buffer (the normalisers' statistics): equal on ranks whose weights are."""
    return sum(float(value.double().sum()) for value in model.state_dict().values() if value.is_floating_point())


class RankGroup:
    """This process's place in its policy's group of learner ranks, and the collectives they run together. A collective
    that fails (a peer died: gloo's "Connection closed by peer"; or hangs: a timeout) raises `LostPeer`."""

    def __init__(self, cfg: Any, learners: LearnerArrays, policy_id: int, rank: int, device: torch.device):
        """Rank 0 listens on the group's port (topology.group_port, 0: a free one) and publishes it in `learners`;
        the other ranks wait for it there, at most GROUP_TIMEOUT_S (a pinned port they know already)."""
        self.policy_id, self.rank, self.size, self.device = policy_id, rank, cfg.learner_processes_per_policy, device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=GROUP_TIMEOUT_S)
        with self.collective("meeting the group"):
            if rank == 0:
                self.store = dist.TCPStore(cfg.learner_master_addr, group_port(cfg, policy_id), self.size,
                                           is_master=True, timeout=timeout, wait_for_workers=False)
                learners.group_port[policy_id] = self.store.port
            else:
                port = group_port(cfg, policy_id) or self._published_port(learners)
                self.store = dist.TCPStore(cfg.learner_master_addr, port, is_master=False, timeout=timeout)
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=self.store, rank=rank,
                                    world_size=self.size, timeout=timeout)
        self.port = self.store.port

    def _published_port(self, learners: LearnerArrays) -> int:
        deadline = time.monotonic() + GROUP_TIMEOUT_S
        while not learners.group_port[self.policy_id]:
            if time.monotonic() > deadline:
                raise LostPeer(f"policy {self.policy_id} rank {self.rank}: rank 0 published no port within "
                               f"{GROUP_TIMEOUT_S:g} s")
            time.sleep(PORT_POLL_S)
        return int(learners.group_port[self.policy_id])

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """Turns the failure of a collective into a `LostPeer`: the rank that died is to blame, not this one."""
        try:
            yield
        except RuntimeError as exc:  # gloo, NCCL and the store raise RuntimeErrors (DistError among them)
            raise LostPeer(f"policy {self.policy_id} rank {self.rank}: {what} failed, another rank is gone or stuck "
                           f"({first_sentence(str(exc)) or type(exc).__name__})") from exc

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def order(self, order: Order | None = None) -> Order:
        """Rank 0 sends `order`; the others receive and return it."""
        message = [order]
        with self.collective("an order"):
            dist.broadcast_object_list(message, src=0, device=self.device)
        return message[0]

    def barrier(self) -> None:
        """Wait until every rank is here (rank 0 releases slots only after every rank has copied them)."""
        with self.collective("a barrier"):
            dist.barrier(device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def agree_on_pass(self, go_on: bool, minibatch_order: torch.Tensor | None, n: int) -> tuple[bool, torch.Tensor]:
        """Rank 0's decision whether another pass runs, and its order of the n trajectories for it, on every rank."""
        message = torch.empty(n + 1, dtype=torch.long, device=self.device)
        if self.rank == 0:
            message[0] = int(go_on)
            if go_on:
                message[1:] = minibatch_order
        with self.collective("a pass's minibatches"):
            dist.broadcast(message, src=0)
        return bool(message[0]), message[1:]

    def share(self, n: int) -> slice:
        """This rank's rows of a minibatch of n trajectories: consecutive, as equal as they can be."""
        bounds = [n * r // self.size for r in range(self.size + 1)]
        return slice(bounds[self.rank], bounds[self.rank + 1])

    def sum_gradients(self, model: torch.nn.Module, finite: torch.Tensor, stats: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sum every parameter's gradient over the ranks, and `stats` (each rank's share of the minibatch's statistics)
        with them; `finite` is this rank's 0-dim bool tensor, whether its loss was finite. Returns whether every
        rank's was (a 0-dim bool tensor: where one was not, the sum holds what that rank's gradient held and the step
        is skipped), and the summed statistics. Every parameter gets a gradient (zero where none was computed)."""
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [stats.to(self.device, torch.float32).reshape(-1),
                                                           (~finite).to(self.device, torch.float32).reshape(1)])
        with self.collective("summing the gradients"):
            dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        return flat[-1] == 0, flat[offset:offset + stats.numel()]

    def checksums(self, model: torch.nn.Module) -> list[float]:
        """Every rank's `weights_checksum`, in rank order."""
        mine = torch.tensor([weights_checksum(model)], dtype=torch.float64, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.size)]
        with self.collective("comparing the weights"):
            dist.all_gather(every, mine)
        return [float(value) for value in every]


class GroupLeader:
    """Rank 0's side of the group (the learner holds one when --learner_processes_per_policy > 1): the orders it sends,
    each with the policy's counters and hyper-parameters, and its whole state while the other ranks lack it (at the
    start, after a PBT adoption)."""

    def __init__(self, cfg: Any, learners: LearnerArrays, policy: Policy, device: torch.device):
        self.ranks = RankGroup(cfg, learners, policy.policy_id, 0, device)
        self.policy, self.resync, self.trained = policy, True, 0  # trained: training orders sent
        log.info("policy %d: %d learner ranks on %s, meeting on port %d", policy.policy_id, self.ranks.size,
                 f"{self.ranks.size} GPUs" if device.type == "cuda" else
                 f"the CPU ({len(os.sched_getaffinity(0))} cores, shared with the rest of the run)", self.ranks.port)
        self.order("idle")

    def order(self, kind: str, slots: Sequence[int] = (), check_weights: bool = False) -> None:
        policy = self.policy
        self.ranks.order(Order(kind, list(slots), policy.version, policy.min_version, policy.env_steps,
                               policy.hyperparams.as_dict(), state_bytes(policy.state_dict()) if self.resync else None,
                               check_weights, policy.lr_factor))
        self.resync, self.last_order = False, time.monotonic()

    def share_slots(self, slots: Sequence[int]) -> None:
        """The other ranks copy these slots too; returns once they have (the slots may then go back to the actors).
        Every WEIGHTS_CHECK_EVERY iterations the ranks first compare their weights (`check_weights`)."""
        self.trained += 1
        check = self.trained % WEIGHTS_CHECK_EVERY == 0
        self.order("train", slots, check)
        if check:
            self.check_weights()
        self.ranks.barrier()

    def check_weights(self) -> None:
        """Compare the ranks' weights (with the state the order may have brought); if they differ, say so and send
        rank 0's whole state with the next order."""
        checksums = self.ranks.checksums(self.policy.model)
        if len(set(checksums)) > 1:
            log.warning("policy %d: the learner ranks' weights differ (checksums by rank: %s); rank 0's weights go to "
                        "every rank with the next order", self.policy.policy_id,
                        ", ".join(f"{value:.17g}" for value in checksums))
            self.resync = True

    def keep_in_step(self) -> None:
        """An idle order when none went out for HEARTBEAT_S, so the others' wait never reaches GROUP_TIMEOUT_S."""
        if time.monotonic() - self.last_order > HEARTBEAT_S:
            self.order("idle")

    def stop(self) -> None:
        self.order("stop")
        self.ranks.leave()


def group_leader(cfg: Any, learners: LearnerArrays, policy: Policy, device: torch.device) -> GroupLeader | None:
    """Rank 0's `GroupLeader` with --learner_processes_per_policy > 1; None for a lone learner."""
    return GroupLeader(cfg, learners, policy, device) if cfg.learner_processes_per_policy > 1 else None
