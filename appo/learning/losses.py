"""The maths of APPO as small pure functions over [n, T] tensors (n trajectories of T steps).

`dones[:, t] = 1` means the episode ended with the action at step t, so step t+1 is not bootstrapped.
`bootstrap` [n] is the value of the observation after the last step.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return x.mean()
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def shaped_rewards(rewards: Tensor, truncated: Tensor, values: Tensor, gamma: float, scale: float, clip: float,
                   bootstrap_truncated: bool) -> Tensor:
    """The rewards the learner learns from: the env's, scaled and clipped to +-clip. Where a time limit
    cut the episode (`truncated`), `gamma * V(s_t)` is added: the state had a future, only the final
    observation is gone, so the value of the last state stands in for the one after it."""
    shaped = (rewards * scale).clamp(-clip, clip)
    if bootstrap_truncated:
        shaped = shaped + gamma * values * truncated
    return shaped


def gae(rewards: Tensor, dones: Tensor, values: Tensor, bootstrap: Tensor, gamma: float, lam: float
        ) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation; returns (advantages, value targets = advantages + values)."""
    advantages = torch.empty_like(values)
    running = torch.zeros_like(bootstrap)
    next_value = bootstrap
    for t in reversed(range(values.shape[1])):
        not_done = 1.0 - dones[:, t]
        delta = rewards[:, t] + gamma * not_done * next_value - values[:, t]
        running = delta + gamma * lam * not_done * running
        advantages[:, t] = running
        next_value = values[:, t]
    return advantages, advantages + values


def turn_gae(rewards: Tensor, dones: Tensor, truncated: Tensor, values: Tensor, bootstrap: Tensor, acting: Tensor,
             gamma: float, lam: float) -> tuple[Tensor, Tensor, Tensor]:
    """GAE over the moves of a seat in a turn-based game, its waiting steps passed through; returns (advantages,
    value targets, known) [n, T].

    `acting` [n, T+1] says where the seat was to move (column T: the bootstrap observation). A waiting step is no
    decision: its reward and episode end belong to the seat's move before it, and that move's next state is the
    seat's next turn, so gamma and lambda apply once a move and no waiting state's value is needed. A move whose next
    turn lies past the trajectory (or past a time limit hit while waiting) has no known return: `known` is 0 there,
    and the moves before it bootstrap from its value. Waiting steps have advantage 0 and `known` 0. With every step
    acting this is `gae`."""
    advantages, known = torch.zeros_like(values), torch.zeros_like(values)
    running, next_value = torch.zeros_like(bootstrap), bootstrap
    carry_reward, carry_done = torch.zeros_like(bootstrap), torch.zeros_like(bootstrap)
    unknown = 1.0 - acting[:, -1]
    for t in reversed(range(values.shape[1])):
        act, done = acting[:, t] > 0, dones[:, t]
        reward = rewards[:, t] + (1.0 - done) * carry_reward
        ended = torch.maximum(done, carry_done)
        # A time limit on an acting step is credited in its reward (`shaped_rewards`); on a waiting one it is not.
        unknown = (1.0 - done) * unknown + done * truncated[:, t] * (~act).float()
        delta = reward + gamma * (1.0 - ended) * next_value - values[:, t]
        move_advantage = (delta + gamma * lam * (1.0 - ended) * running) * (1.0 - unknown)
        advantages[:, t] = torch.where(act, move_advantage, 0.0)
        known[:, t] = torch.where(act, 1.0 - unknown, 0.0)
        running = torch.where(act, move_advantage, running)
        next_value = torch.where(act, values[:, t], next_value)
        carry_reward = torch.where(act, 0.0, reward)
        carry_done = torch.where(act, 0.0, ended)
        unknown = torch.where(act, 0.0, unknown)
    return advantages, advantages + values, known


def vtrace(behaviour_log_probs: Tensor, target_log_probs: Tensor, rewards: Tensor, dones: Tensor,
           values: Tensor, bootstrap: Tensor, gamma: float, rho_bar: float, c_bar: float
           ) -> tuple[Tensor, Tensor]:
    """V-trace (Espeholt et al. 2018): returns (value targets v_s, policy-gradient advantages).

    v_s = V(x_s) + sum_t gamma^(t-s) (prod_{i<t} c_i) rho_t (r_t + gamma V(x_t+1) - V(x_t)), computed
    backwards; advantages are rho_s (r_s + gamma v_{s+1} - V(x_s)).
    """
    ratios = torch.exp(target_log_probs - behaviour_log_probs)
    rhos = ratios.clamp(max=rho_bar)
    cs = ratios.clamp(max=c_bar)
    vs = torch.empty_like(values)
    advantages = torch.empty_like(values)
    next_value = bootstrap
    next_vs = bootstrap
    for t in reversed(range(values.shape[1])):
        discount = gamma * (1.0 - dones[:, t])
        delta = rhos[:, t] * (rewards[:, t] + discount * next_value - values[:, t])
        vs[:, t] = values[:, t] + delta + discount * cs[:, t] * (next_vs - next_value)
        advantages[:, t] = rhos[:, t] * (rewards[:, t] + discount * next_vs - values[:, t])
        next_value, next_vs = values[:, t], vs[:, t]
    return vs, advantages


def ppo_policy_loss(ratio: Tensor, advantages: Tensor, clip_ratio: float, mask: Tensor | None = None) -> Tensor:
    """Clipped surrogate with the symmetric clip range [1/(1+e), 1+e]; a loss to minimise."""
    clipped = ratio.clamp(1.0 / (1.0 + clip_ratio), 1.0 + clip_ratio)
    surrogate = torch.min(ratio * advantages, clipped * advantages)
    return -masked_mean(surrogate, mask)


def kl_penalty(log_ratio: Tensor, mask: Tensor | None = None) -> Tensor:
    """KL(behaviour || current) estimated from actions the behaviour policy took: the mean of r - 1 - log r, with
    r = exp(log_ratio) = pi(a) / mu(a). Each term is >= 0 and 0 where the policy has not moved; its expectation under
    mu is the KL. Unlike the clipped surrogate, its gradient grows the further a sample's ratio has gone."""
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask)


def clipped_value_loss(values: Tensor, old_values: Tensor, targets: Tensor, clip_value: float,
                       mask: Tensor | None = None) -> Tensor:
    """0.5 * max of the plain and the clipped squared error; values move at most clip_value from old_values."""
    clipped = old_values + (values - old_values).clamp(-clip_value, clip_value)
    loss = torch.max((values - targets).pow(2), (clipped - targets).pow(2))
    return 0.5 * masked_mean(loss, mask)


def normalize(x: Tensor, mask: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean).pow(2), mask)
    return (x - mean) / (var.sqrt() + eps)
