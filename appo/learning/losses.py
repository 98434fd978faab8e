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


def backward_recurrence(a: Tensor, b: Tensor, last: Tensor) -> Tensor:
    """x [..., T] with x_t = a_t + b_t * x_{t+1} and x_T = `last` [...]: the shape of every return and advantage here
    (a's leading dims may stack several recurrences that share b). Computed by doubling (x_t as a_t + b_t * (a_{t+1}
    + b_{t+1} * ...) composed over 1, 2, 4, ... steps at once), so log2(T) rounds of whole-tensor operations rather
    than a Python loop of T steps."""
    span = 1
    while span < a.shape[-1]:
        a = torch.cat([a[..., :-span] + b[..., :-span] * a[..., span:], a[..., -span:]], dim=-1)
        b = torch.cat([b[..., :-span] * b[..., span:], b[..., -span:]], dim=-1)
        span *= 2
    return a + b * last[..., None]


def next_steps(x: Tensor, last: Tensor) -> Tensor:
    """x [..., T] shifted one step back, `last` [...] after its end: the value at t+1 for every t."""
    return torch.cat([x[..., 1:], last[..., None]], dim=-1)


def gae(rewards: Tensor, dones: Tensor, values: Tensor, bootstrap: Tensor, gamma: float, lam: float
        ) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation; returns (advantages, value targets = advantages + values).
    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}, delta_t = r_t + gamma * (1 - done_t) * V_{t+1} - V_t."""
    not_done = 1.0 - dones
    deltas = rewards + gamma * not_done * next_steps(values, bootstrap) - values
    advantages = backward_recurrence(deltas, gamma * lam * not_done, torch.zeros_like(bootstrap))
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
    act = acting[:, :-1]
    waits = 1.0 - act
    zero = torch.zeros_like(bootstrap)
    # What the waiting steps from t on, up to the seat's next move, pass back to the move before them: their rewards
    # up to an episode end, whether an episode ended, and whether the move's return is unknown (the trajectory ran out
    # first, or a time limit was hit while waiting; one hit on a move is credited in its reward, `shaped_rewards`).
    not_done = 1.0 - dones
    last = torch.stack([zero, zero, 1.0 - acting[:, -1]])
    passed = backward_recurrence(waits * torch.stack([rewards, dones, dones * truncated]), waits * not_done, last)
    passed_reward, passed_end, passed_unknown = next_steps(passed, last)
    reward = rewards + not_done * passed_reward
    ended = dones + not_done * passed_end
    known = act * (1.0 - not_done * passed_unknown)
    # The value of the seat's next move (the bootstrap when there is none in the trajectory).
    next_value = next_steps(backward_recurrence(act * values, waits, bootstrap), bootstrap)
    deltas = reward + gamma * (1.0 - ended) * next_value - values
    # A move's advantage adds its next move's, discounted once; waiting steps pass it through unchanged.
    running = backward_recurrence(known * deltas, known * gamma * lam * (1.0 - ended) + waits, zero)
    advantages = known * running
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
    discounts = gamma * (1.0 - dones)
    next_values = next_steps(values, bootstrap)
    deltas = rhos * (rewards + discounts * next_values - values)
    vs = values + backward_recurrence(deltas, discounts * cs, torch.zeros_like(bootstrap))
    advantages = rhos * (rewards + discounts * next_steps(vs, bootstrap) - values)
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
    """x (where `mask` is 1) to mean 0 and std 1. A single value is kept as it is: normalised it would be 0, and a
    minibatch of one move would train its policy on nothing (decided on the device, no host sync)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean).pow(2), mask)
    count = x.new_tensor(x.numel()) if mask is None else mask.sum()
    return torch.where(count > 1, (x - mean) / (var.sqrt() + eps), x)
