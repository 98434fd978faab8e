"""Publishing a learner's weights to its inference workers through a shared-memory buffer.

The learner copies its float state (parameters and buffers) into one flat named shared-memory
segment guarded by a seqlock (`SharedControl.weights_seq`: odd while a copy is in progress), then
bumps `SharedControl.policy_version`. Inference workers notice the version move on their next batch
and copy the weights in without blocking the learner; a torn copy is detected and retried.

The segment outlives a learner that dies: its replacement attaches to it and starts from the weights
published last, which are newer than any checkpoint.
"""

from __future__ import annotations

import mmap
import time

import numpy as np
import torch
from torch import nn

from appo.memory.control import SharedControl
from appo.memory.segments import attach_segment, open_segment, read_weights, write_weights


def _state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """What is published: the float entries of the state dict (parameters and normalisation statistics)."""
    return {name: t for name, t in model.state_dict(keep_vars=True).items() if t.is_floating_point()}


def frozen_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of what `publish` would write: a self-play snapshot of the model."""
    return {name: t.detach().cpu().clone() for name, t in _state_tensors(model).items()}


class _FlatWeights:
    """A model's published float state as views into one flat float32 segment, in `_state_tensors` order."""

    def __init__(self, model: nn.Module, segment: mmap.mmap):
        self.segment = segment
        named = _state_tensors(model)
        self.names, self.tensors = list(named), list(named.values())
        self.sizes = [t.numel() for t in self.tensors]
        self.flat = torch.from_numpy(np.ndarray((sum(self.sizes),), dtype=np.float32, buffer=segment))
        self.views = list(torch.split(self.flat, self.sizes))

    @staticmethod
    def nbytes(model: nn.Module) -> int:
        return 4 * sum(t.numel() for t in _state_tensors(model).values())


class WeightsPublisher(_FlatWeights):
    """Learner side: owns the write end of one acting id's weights segment (its policy's, or a self-play
    snapshot's: then `publish_frozen` writes a snapshot taken of the same model)."""

    def __init__(self, model: nn.Module, name: str, control: SharedControl, policy_id: int):
        # The segment exists already when a predecessor of this learner made it (and may have published into it).
        super().__init__(model, open_segment(name, self.nbytes(model)))
        self.control, self.policy_id = control, policy_id

    @torch.no_grad()
    def load_published(self) -> int | None:
        """Copy the weights a predecessor published last into the model and return their version; None when
        there are none, or when it died in the middle of writing them (see `read_frozen`)."""
        frozen = self.read_frozen()
        if frozen is None:
            return None
        for name, tensor in zip(self.names, self.tensors):
            tensor.copy_(frozen[name])
        return int(self.control.learners.policy_version[self.policy_id])

    @torch.no_grad()
    def publish(self, version: int) -> None:
        self._write(self.tensors, version)

    def publish_frozen(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Publish a `frozen_weights` copy (a snapshot) instead of the model's current weights."""
        self._write([weights[name] for name in self.names], version)

    def read_frozen(self) -> dict[str, torch.Tensor] | None:
        """A `frozen_weights` copy of what was published last; None before the first publication, or after a
        writer died in the middle of one (the seqlock is left odd, and evened here)."""
        seq = self.control.learners.weights_seq
        if seq[self.policy_id] % 2:
            seq[self.policy_id] += 1
            return None
        if self.control.learners.policy_version[self.policy_id] < 0:
            return None
        return {name: view.view_as(t).clone() for name, view, t in zip(self.names, self.views, self.tensors)}

    @torch.no_grad()
    def _write(self, tensors: list[torch.Tensor], version: int) -> None:
        def copy_in() -> None:
            for view, tensor in zip(self.views, tensors):
                view.copy_(tensor.detach().reshape(-1))

        write_weights(self.control, self.policy_id, copy_in, version)


class WeightsSubscriber(_FlatWeights):
    """Inference side: copies newly published weights into the local model."""

    def __init__(self, model: nn.Module, name: str, control: SharedControl, policy_id: int):
        while control.learners.policy_version[policy_id] < 0:  # the learner has not published yet
            if control.runner.stop[0]:
                raise SystemExit(0)
            time.sleep(0.01)
        super().__init__(model, attach_segment(name))
        self.control, self.policy_id = control, policy_id
        self.version = -1

    @torch.no_grad()
    def update(self) -> bool:
        """Load the published weights if their version moved; True when new weights were loaded."""
        version = int(self.control.learners.policy_version[self.policy_id])
        if version == self.version:
            return False
        snapshot = read_weights(self.control, self.policy_id, self.flat.clone)
        for view, tensor in zip(torch.split(snapshot, self.sizes), self.tensors):
            tensor.copy_(view.view_as(tensor))
        self.version = version
        return True


def share_snapshots(snapshots: list[dict | None], publishers: list[WeightsPublisher], control: SharedControl) -> None:
    """Make a policy's self-play pool (`snapshots`, Policy.snapshots) and its segments in shared memory agree:
    snapshots that a predecessor of this learner published are newer than the checkpoint's and are taken back;
    otherwise the checkpoint's are published."""
    for k, publisher in enumerate(publishers):
        published = publisher.read_frozen()
        if published is not None:
            version = int(control.learners.policy_version[publisher.policy_id])
            snapshots[k] = {"version": version, "weights": published}
        elif snapshots[k] is not None:
            publisher.publish_frozen(snapshots[k]["weights"], snapshots[k]["version"])


def weights_bytes(spaces: tuple, cfg) -> int:
    """The size of one acting id's weights segment for a model of these spaces and flags."""
    from appo.learning.model import ActorCritic

    return _FlatWeights.nbytes(ActorCritic(*spaces, cfg))
