"""Actor-critic model: MLP encoder, optional GRU/LSTM core, policy and value heads.

Inference calls `forward_step` on a batch of single steps; the learner calls `forward_sequence` on
trajectories cut into chunks of `--recurrence` steps, resetting the recurrent state after episode ends
exactly as the actors did while collecting.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn


class ActionDistribution:
    """Categorical (Discrete) or diagonal Gaussian (Box) over a flat parameter tensor.

    Discrete: params are logits [..., n]. Box: params are [..., 2 * dim] = mean then log-std.
    """

    def __init__(self, params: Tensor, discrete: bool):
        self.discrete = discrete
        if discrete:
            self.log_pmf = torch.log_softmax(params, dim=-1)
        else:
            self.mean, log_std = params.chunk(2, dim=-1)
            self.log_std = log_std.clamp(-5.0, 2.0)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        if self.discrete:
            probs = self.log_pmf.exp().reshape(-1, self.log_pmf.shape[-1])
            return torch.multinomial(probs, 1, generator=generator).reshape(self.log_pmf.shape[:-1])
        noise = torch.randn(self.mean.shape, generator=generator, device=self.mean.device)
        return self.mean + self.log_std.exp() * noise

    def log_prob(self, actions: Tensor) -> Tensor:
        if self.discrete:
            return self.log_pmf.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        z = (actions - self.mean) / self.log_std.exp()
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> Tensor:
        if self.discrete:
            return -(self.log_pmf.exp() * self.log_pmf).sum(-1)
        return (self.log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)

    def symmetric_kl_to_prior(self) -> Tensor:
        """KL(pi || prior) + KL(prior || pi); prior is uniform (Discrete) or N(0, 1) per dim (Box)."""
        if self.discrete:
            n = self.log_pmf.shape[-1]
            log_uniform = -math.log(n)
            probs = self.log_pmf.exp()
            kl_pi_prior = (probs * (self.log_pmf - log_uniform)).sum(-1)
            kl_prior_pi = ((log_uniform - self.log_pmf) / n).sum(-1)
            return kl_pi_prior + kl_prior_pi
        var = (2 * self.log_std).exp()
        mean_sq = self.mean.pow(2)
        kl_pi_prior = 0.5 * (var + mean_sq - 1.0) - self.log_std
        kl_prior_pi = 0.5 * ((1.0 + mean_sq) / var - 1.0) + self.log_std
        return (kl_pi_prior + kl_prior_pi).sum(-1)


def _linear(in_size: int, out_size: int, gain: float) -> nn.Linear:
    layer = nn.Linear(in_size, out_size)
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    def __init__(self, obs_space: gym.spaces.Box, action_space: gym.Space, cfg):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.obs_is_uint8 = np.dtype(obs_space.dtype) == np.uint8
        self.use_rnn = cfg.use_rnn
        self.rnn_type = cfg.rnn_type
        hidden = cfg.hidden_size

        layers: list[nn.Module] = []
        size = int(math.prod(obs_space.shape))
        for _ in range(cfg.mlp_layers):
            layers += [_linear(size, hidden, math.sqrt(2)), nn.Tanh()]
            size = hidden
        self.encoder = nn.Sequential(nn.Flatten(), *layers)

        if cfg.use_rnn:
            cell = nn.GRUCell if cfg.rnn_type == "gru" else nn.LSTMCell
            self.core = cell(size, hidden)
            size = hidden

        if self.discrete:
            self.policy_head = _linear(size, int(action_space.n), 0.01)
        else:
            self.policy_head = _linear(size, int(math.prod(action_space.shape)), 0.01)
            self.log_std = nn.Parameter(torch.zeros(int(math.prod(action_space.shape))))
        self.value_head = _linear(size, 1, 1.0)

    def _encode(self, obs: Tensor) -> Tensor:
        x = obs.float()
        if self.obs_is_uint8:
            x = x / 255.0
        return self.encoder(x)

    def _core_step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        if self.rnn_type == "gru":
            h = self.core(x, state)
            return h, h
        h, c = self.core(x, state.chunk(2, dim=-1))
        return h, torch.cat([h, c], dim=-1)

    def _heads(self, x: Tensor) -> tuple[Tensor, Tensor]:
        params = self.policy_head(x)
        if not self.discrete:
            params = torch.cat([params, self.log_std.expand_as(params)], dim=-1)
        return params, self.value_head(x).squeeze(-1)

    def distribution(self, params: Tensor) -> ActionDistribution:
        return ActionDistribution(params, self.discrete)

    def forward_step(self, obs: Tensor, rnn_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One step for a batch of agents: (action params, values, next rnn states)."""
        x = self._encode(obs)
        if self.use_rnn:
            x, rnn_states = self._core_step(x, rnn_states)
        params, values = self._heads(x)
        return params, values, rnn_states

    def forward_sequence(self, obs: Tensor, rnn_states: Tensor, dones: Tensor) -> tuple[Tensor, Tensor]:
        """Sequences obs [n, L, ...] from start states [n, H]; dones [n, L] reset the state after a step."""
        n, length = obs.shape[:2]
        x = self._encode(obs.reshape(n * length, *obs.shape[2:]))
        if self.use_rnn:
            x = x.reshape(n, length, -1)
            keep = (1.0 - dones.float()).unsqueeze(-1)
            state, outputs = rnn_states, []
            for t in range(length):
                out, state = self._core_step(x[:, t], state)
                outputs.append(out)
                state = state * keep[:, t]
            x = torch.stack(outputs, dim=1).reshape(n * length, -1)
        params, values = self._heads(x)
        return params.reshape(n, length, -1), values.reshape(n, length)
