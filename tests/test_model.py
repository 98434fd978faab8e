"""Model: recurrent state handling, distributions."""

import argparse
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from appo.learner import forward_trajectories
from appo.model import ActionDistribution, ActorCritic


def make_cfg(**overrides):
    cfg = dict(hidden_size=16, mlp_layers=2, use_rnn=True, rnn_type="gru", recurrence=4)
    cfg.update(overrides)
    return argparse.Namespace(**cfg)


OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_sequence_matches_steps_with_reset_at_episode_end(rnn_type):
    torch.manual_seed(0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), make_cfg(rnn_type=rnn_type))
    state_size = 16 * (2 if rnn_type == "lstm" else 1)
    obs = torch.randn(2, 6, 3)
    dones = torch.zeros(2, 6)
    dones[0, 2] = 1.0  # episode of trajectory 0 ends after step 2
    start = torch.randn(2, state_size)

    params, values = model.forward_sequence(obs, start, dones)

    state = start
    for t in range(6):
        step_params, step_values, state = model.forward_step(obs[:, t], state)
        assert torch.allclose(step_params, params[:, t], atol=1e-6)
        assert torch.allclose(step_values, values[:, t], atol=1e-6)
        state = state * (1 - dones[:, t:t + 1])

    # Without the reset, step 3 onwards of trajectory 0 would differ.
    _, values_no_reset = model.forward_sequence(obs, start, torch.zeros(2, 6))
    assert not torch.allclose(values_no_reset[0, 3:], values[0, 3:])
    assert torch.allclose(values_no_reset[1], values[1])


def test_reset_state_equals_fresh_episode():
    """After a done, the next step sees exactly a zero state, as at the start of an episode."""
    torch.manual_seed(1)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), make_cfg())
    obs = torch.randn(1, 4, 3)
    dones = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    _, values = model.forward_sequence(obs, torch.randn(1, 16), dones)
    _, fresh = model.forward_sequence(obs[:, 2:], torch.zeros(1, 16), torch.zeros(1, 2))
    assert torch.allclose(values[:, 2:], fresh, atol=1e-6)


def test_learner_chunks_start_from_recorded_states():
    """forward_trajectories cuts T=8 into chunks of recurrence=4 that start from the stored states."""
    torch.manual_seed(2)
    cfg = make_cfg(recurrence=4)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), cfg)
    obs = torch.randn(3, 9, 3)
    rnn_states = torch.randn(3, 9, 16)
    dones = torch.zeros(3, 8)
    _, values = forward_trajectories(model, cfg, {"obs": obs, "rnn_states": rnn_states, "dones": dones})
    _, second_chunk = model.forward_sequence(obs[:, 4:8], rnn_states[:, 4], dones[:, 4:8])
    assert torch.allclose(values[:, 4:], second_chunk, atol=1e-6)


def test_feedforward_shapes_box_actions():
    model = ActorCritic(OBS, gym.spaces.Box(-2, 2, (2,), np.float32), make_cfg(use_rnn=False, recurrence=1))
    params, values, state = model.forward_step(torch.randn(5, 3), torch.zeros(5, 1))
    assert params.shape == (5, 4) and values.shape == (5,)
    actions = model.distribution(params).sample()
    assert actions.shape == (5, 2)


def test_distributions_match_torch():
    logits = torch.randn(4, 3)
    dist = ActionDistribution(logits, discrete=True)
    reference = torch.distributions.Categorical(logits=logits)
    actions = torch.tensor([0, 2, 1, 2])
    assert torch.allclose(dist.log_prob(actions), reference.log_prob(actions))
    assert torch.allclose(dist.entropy(), reference.entropy())

    mean, log_std = torch.randn(4, 2), torch.randn(4, 2) * 0.3
    dist = ActionDistribution(torch.cat([mean, log_std], -1), discrete=False)
    reference = torch.distributions.Normal(mean, log_std.exp())
    actions = torch.randn(4, 2)
    assert torch.allclose(dist.log_prob(actions), reference.log_prob(actions).sum(-1), atol=1e-5)
    assert torch.allclose(dist.entropy(), reference.entropy().sum(-1), atol=1e-5)


def test_symmetric_kl_is_zero_at_prior_and_positive_elsewhere():
    uniform = ActionDistribution(torch.zeros(1, 4), discrete=True)
    assert uniform.symmetric_kl_to_prior().item() == pytest.approx(0.0, abs=1e-6)
    peaked = ActionDistribution(torch.tensor([[5.0, 0.0]]), discrete=True)
    p = torch.softmax(torch.tensor([5.0, 0.0]), 0)
    expected = (p * (p / 0.5).log()).sum() + (0.5 * (0.5 / p).log()).sum()
    assert peaked.symmetric_kl_to_prior().item() == pytest.approx(expected.item(), rel=1e-5)
    standard = ActionDistribution(torch.zeros(1, 4), discrete=False)
    assert standard.symmetric_kl_to_prior().item() == pytest.approx(0.0, abs=1e-6)
    shifted = ActionDistribution(torch.tensor([[1.0, math.log(2.0)]]), discrete=False)
    # KL(N(1,4)||N(0,1)) + KL(N(0,1)||N(1,4)) = (0.5*(4+1-1) - ln2) + (0.5*((1+1)/4 - 1) + ln2)
    assert shifted.symmetric_kl_to_prior().item() == pytest.approx(2.0 - 0.25, rel=1e-5)
