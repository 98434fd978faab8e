"""Publishing a learner's weights to its inference workers through a shared-memory buffer.

The learner copies its float state (parameters and buffers) into one flat named shared-memory
segment guarded by a seqlock (`SamplerState.weights_seq`: odd while a copy is in progress), then
bumps `SamplerState.policy_version`. Inference workers notice the version move on their next batch
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

from appo.buffers import SamplerState, attach_segment, create_segment


def _state_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [t for t in model.state_dict(keep_vars=True).values() if t.is_floating_point()]


class _FlatWeights:
    def __init__(self, model: nn.Module, segment: mmap.mmap):
        self.segment = segment
        self.tensors = _state_tensors(model)
        self.sizes = [t.numel() for t in self.tensors]
        self.flat = torch.from_numpy(np.ndarray((sum(self.sizes),), dtype=np.float32, buffer=segment))
        self.views = list(torch.split(self.flat, self.sizes))

    @staticmethod
    def nbytes(model: nn.Module) -> int:
        return 4 * sum(t.numel() for t in _state_tensors(model))


class WeightsPublisher(_FlatWeights):
    """Learner side: owns the write end of one policy's weights segment."""

    def __init__(self, model: nn.Module, name: str, sampler: SamplerState, policy_id: int):
        # A version >= 0 means a predecessor of this learner made the segment and published into it.
        predecessor = sampler.policy_version[policy_id] >= 0
        super().__init__(model, attach_segment(name) if predecessor else create_segment(name, self.nbytes(model)))
        self.sampler, self.policy_id = sampler, policy_id

    @torch.no_grad()
    def load_published(self) -> int | None:
        """Copy the weights a predecessor published last into the model and return their version; None when
        there are none, or when it died in the middle of writing them (odd seqlock; the counter is evened)."""
        version, seq = int(self.sampler.policy_version[self.policy_id]), self.sampler.weights_seq
        if seq[self.policy_id] % 2:
            seq[self.policy_id] += 1
            return None
        if version < 0:
            return None
        for view, tensor in zip(self.views, self.tensors):
            tensor.copy_(view.view_as(tensor))
        return version

    @torch.no_grad()
    def publish(self, version: int) -> None:
        seq = self.sampler.weights_seq
        seq[self.policy_id] += 1
        for view, tensor in zip(self.views, self.tensors):
            view.copy_(tensor.detach().reshape(-1))
        seq[self.policy_id] += 1
        self.sampler.policy_version[self.policy_id] = version


class WeightsSubscriber(_FlatWeights):
    """Inference side: copies newly published weights into the local model."""

    def __init__(self, model: nn.Module, name: str, sampler: SamplerState, policy_id: int):
        while sampler.policy_version[policy_id] < 0:  # the learner has not published yet
            if sampler.stop[0]:
                raise SystemExit(0)
            time.sleep(0.01)
        super().__init__(model, attach_segment(name))
        self.sampler, self.policy_id = sampler, policy_id
        self.version = -1

    @torch.no_grad()
    def update(self) -> bool:
        """Load the published weights if their version moved; True when new weights were loaded."""
        version = int(self.sampler.policy_version[self.policy_id])
        if version == self.version:
            return False
        seq = self.sampler.weights_seq
        while True:
            before = int(seq[self.policy_id])
            if before % 2 == 0:
                snapshot = self.flat.clone()
                if int(seq[self.policy_id]) == before:
                    break
            time.sleep(0.0001)
        for view, tensor in zip(torch.split(snapshot, self.sizes), self.tensors):
            tensor.copy_(view.view_as(tensor))
        self.version = version
        return True
