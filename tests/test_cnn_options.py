"""The CNN's compute options on a CPU (scripts/bench_cnn.py measures them): each agrees with float32 eager within its
tolerance on Breakout- and Doom-shaped observations, and training through it reaches every weight."""

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from appo.config.cfg import make_config
from appo.envs.doom.actions import FULL_BUTTONS, ActionSet
from appo.learning.model import ActorCritic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOAT32_TOLERANCE, BF16_TOLERANCE = 1e-4, 3e-2  # relative L2 error of the outputs (scripts/bench_cnn.py's)

SPACES = {
    "breakout": (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4)),
    "doom": (gym.spaces.Dict({"obs": gym.spaces.Box(0, 255, (3, 72, 128), np.uint8),
                              "measurements": gym.spaces.Box(-np.inf, np.inf, (15,), np.float32)}),
             ActionSet(FULL_BUTTONS).space),
}


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    return float((x.float() - reference).norm() / reference.norm())


def model_and_inputs(shape: str, n: int = 8):
    """A model for `shape` and n single steps of random observations."""
    torch.manual_seed(0)
    obs_space, action_space = SPACES[shape]
    model = ActorCritic(obs_space, action_space, make_config(env="unused"))
    spaces = obs_space.spaces if isinstance(obs_space, gym.spaces.Dict) else {"obs": obs_space}
    obs = {key: torch.randint(0, 256, (n, 1, *s.shape), dtype=torch.uint8) if s.dtype == np.uint8
           else torch.randn(n, 1, *s.shape) for key, s in spaces.items()}
    return model, obs, torch.zeros(n, model.state_size), torch.zeros(n, 1)


def outputs(model, obs, states, dones, grad: bool):
    """Logits and values; with `grad` as the learner computes them (autocast), else as inference does."""
    with torch.set_grad_enabled(grad):
        params, values = model.forward_sequence(obs, states, dones)
    return params.detach(), values.detach()


@pytest.mark.parametrize("shape", SPACES)
@pytest.mark.parametrize("option", ["bf16_inference", "bf16_learner", "channels_last"])
def test_options_agree_with_float32_eager(shape, option):
    model, obs, states, dones = model_and_inputs(shape)
    reference = outputs(model, obs, states, dones, grad=False)
    if option == "channels_last":
        model.to(memory_format=torch.channels_last)
    else:
        model.set_bf16_images(True)
    got = outputs(model, obs, states, dones, grad=option == "bf16_learner")
    tolerance = FLOAT32_TOLERANCE if option == "channels_last" else BF16_TOLERANCE
    for x, ref in zip(got, reference):
        assert x.dtype == torch.float32
        assert relative_error(x, ref) <= tolerance
    if option != "channels_last":
        assert not torch.equal(got[0], reference[0])  # bfloat16 did run


@pytest.mark.parametrize("shape", SPACES)
@pytest.mark.parametrize("option", ["float32", "bf16", "channels_last"])
def test_training_through_each_option_reaches_every_weight(shape, option):
    model, obs, states, dones = model_and_inputs(shape)

    def gradients():
        params, values = model.forward_sequence(obs, states, dones)
        dist = model.distribution(params)
        model.zero_grad(set_to_none=True)
        (-dist.log_prob(dist.mode()).mean() + values.pow(2).mean() - 0.01 * dist.entropy().mean()).backward()
        return [p.grad.detach().clone() for p in model.parameters()]

    reference = gradients()
    if option == "bf16":
        model.set_bf16_images(True)
    elif option == "channels_last":
        model.to(memory_format=torch.channels_last)
    grads = gradients()
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    error = relative_error(torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in reference]))
    assert error <= (0.1 if option == "bf16" else 1e-3)


def test_bf16_inference_copy_follows_every_weight_change_and_stays_out_of_the_state():
    """Inference runs a bfloat16 copy of the encoder's weights: it must be refreshed when the weights are loaded (as
    inference workers receive them) or trained in place, and must not show in the state dict (published weights,
    checkpoints)."""
    model, obs, states, dones = model_and_inputs("breakout")
    keys = list(model.state_dict())
    model.set_bf16_images(True)
    before = outputs(model, obs, states, dones, grad=False)
    autocast = outputs(model, obs, states, dones, grad=True)
    assert relative_error(before[0], autocast[0]) <= BF16_TOLERANCE  # what autocast computes, up to kernel order
    assert list(model.state_dict()) == keys

    other, *_ = model_and_inputs("breakout")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    expected = outputs(other, obs, states, dones, grad=False)  # float32
    with torch.inference_mode():  # as an inference worker's weight update runs
        model.load_state_dict(other.state_dict())
    loaded = outputs(model, obs, states, dones, grad=False)
    assert relative_error(loaded[0], expected[0]) <= BF16_TOLERANCE < relative_error(before[0], expected[0])

    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # a learner's step: weights changed in place
    params, values = model.forward_sequence(obs, states, dones)
    (params.pow(2).mean() + (values - 1.0).pow(2).mean()).backward()
    optimizer.step()
    stepped = outputs(model, obs, states, dones, grad=False)
    model.set_bf16_images(False)
    stepped32 = outputs(model, obs, states, dones, grad=False)
    assert relative_error(stepped32[1], expected[1]) > BF16_TOLERANCE  # the step moved the values
    assert relative_error(stepped[1], stepped32[1]) <= BF16_TOLERANCE


class BatchNormEncoder(nn.Module):
    """A user's image encoder (--encoder=tests.test_cnn_options:BatchNormEncoder) with a BatchNorm: statistics held
    as buffers, and a forward pass that depends on the train or eval mode."""

    def __init__(self, space: gym.spaces.Box, cfg):
        super().__init__()
        self.conv = nn.Conv2d(space.shape[0], 8, 8, stride=4)
        self.norm = nn.BatchNorm2d(8)
        self.out_size = 8 * ((space.shape[1] - 8) // 4 + 1) * ((space.shape[2] - 8) // 4 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x))).flatten(1)


@pytest.mark.slow
def test_bf16_inference_copy_follows_buffers_and_the_train_or_eval_mode():
    """The bfloat16 copy of an encoder with a BatchNorm normalises with the statistics the model holds now (published
    weights carry them into inference workers) and as the model's mode says (batch statistics in train mode)."""
    torch.manual_seed(0)
    obs_space, action_space = SPACES["breakout"]
    model = ActorCritic(obs_space, action_space,
                        make_config(env="unused", encoder="tests.test_cnn_options:BatchNormEncoder")).eval()
    obs = {"obs": torch.randint(0, 256, (8, 1, *obs_space.shape), dtype=torch.uint8)}
    states, dones = torch.zeros(8, model.state_size), torch.zeros(8, 1)

    def bf16_and_float32() -> tuple[torch.Tensor, torch.Tensor]:
        """Values through the bfloat16 copy, then through the float32 model."""
        model.set_bf16_images(True)
        bf16 = outputs(model, obs, states, dones, grad=False)[1]
        model.set_bf16_images(False)
        return bf16, outputs(model, obs, states, dones, grad=False)[1]

    before, _ = bf16_and_float32()  # the copy is made
    norm = model.trunks[0]["encoder"].encoders["obs"].norm
    with torch.inference_mode():  # as an inference worker loads published statistics
        norm.running_mean.copy_(torch.full_like(norm.running_mean, 0.5))
        norm.running_var.copy_(torch.full_like(norm.running_var, 0.01))
    loaded, loaded32 = bf16_and_float32()
    assert relative_error(loaded, loaded32) <= BF16_TOLERANCE < relative_error(before, loaded32)
    model.train()
    batch, batch32 = bf16_and_float32()
    assert relative_error(batch, batch32) <= BF16_TOLERANCE < relative_error(loaded32, batch32)


@pytest.mark.slow
def test_bench_cnn_checks_and_measures_each_option():
    result = subprocess.run([sys.executable, "scripts/bench_cnn.py", "--shapes=breakout", "--options=bf16",
                             "--rounds=1", "--batches=2", "--sgd_batch=32", "--min_seconds=0"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = [line for line in result.stdout.splitlines() if line.startswith(("float32 ", "bf16 "))]
    assert len(checks) == 2 and all(line.endswith(": ok") for line in checks)
    assert "| float32: " in result.stdout and "| bf16: " in result.stdout
