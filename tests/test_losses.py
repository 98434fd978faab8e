"""Returns and losses against straightforward per-trajectory reference loops and hand-made numbers."""

import math
import random

import pytest
import torch

from appo.learning import losses


def reference_gae(rewards, dones, values, bootstrap, gamma, lam):
    """Textbook GAE for one trajectory, written as plainly as possible."""
    T = len(rewards)
    advantages = [0.0] * T
    for t in range(T):
        total, weight = 0.0, 1.0
        for k in range(t, T):
            next_value = bootstrap if k == T - 1 else values[k + 1]
            delta = rewards[k] + gamma * next_value * (1 - dones[k]) - values[k]
            total += weight * delta
            if dones[k]:
                break
            weight *= gamma * lam
        advantages[t] = total
    return advantages


def reference_turn_gae(rewards, dones, truncated, values, bootstrap, acting, gamma, lam):
    """A seat's moves as their own game: each move takes the rewards and the episode end of the waiting steps after it;
    its next state is the seat's next move (or the bootstrap observation, when the seat is to move there). A move whose
    next turn is not in sight has no return (None); textbook GAE over the moves, the sum stopping before such a move."""
    T = len(rewards)
    moves = [t for t in range(T) if acting[t]]
    steps = []  # (reward, done, value of the next move, known) of each move
    for i, t in enumerate(moves):
        reward, done, known, k = rewards[t], dones[t], True, t
        while not done and k + 1 < T and not acting[k + 1]:
            k += 1
            reward, done = reward + rewards[k], dones[k]
            known = not (done and truncated[k])
        if done:
            next_value = 0.0
        elif k + 1 < T:
            next_value = values[moves[i + 1]]
        else:
            next_value, known = bootstrap, known and bool(acting[T])
        steps.append((reward, done, next_value, known))
    advantages, known_moves = [0.0] * T, [0.0] * T
    for i, t in enumerate(moves):
        if not steps[i][3]:
            continue
        known_moves[t] = 1.0
        total, weight = 0.0, 1.0
        for j in range(i, len(moves)):
            reward, done, next_value, _ = steps[j]
            total += weight * (reward + gamma * next_value - values[moves[j]])
            if done or j + 1 == len(moves) or not steps[j + 1][3]:
                break
            weight *= gamma * lam
        advantages[t] = total
    return advantages, known_moves


def reference_vtrace(behaviour, target, rewards, dones, values, bootstrap, gamma, rho_bar, c_bar):
    """V-trace from its definition: v_s = V(x_s) + sum_t gamma^(t-s) (prod c_i) rho_t delta_t V."""
    T = len(rewards)
    rho = [min(rho_bar, math.exp(target[t] - behaviour[t])) for t in range(T)]
    c = [min(c_bar, math.exp(target[t] - behaviour[t])) for t in range(T)]

    def value(k):
        return bootstrap if k == T else values[k]

    vs = []
    for s in range(T):
        total, coeff = 0.0, 1.0
        for t in range(s, T):
            delta = rho[t] * (rewards[t] + gamma * (1 - dones[t]) * value(t + 1) - values[t])
            total += coeff * delta
            if dones[t]:
                break
            coeff *= gamma * c[t]
        vs.append(values[s] + total)
    advantages = []
    for s in range(T):
        next_vs = bootstrap if s == T - 1 else vs[s + 1]
        advantages.append(rho[s] * (rewards[s] + gamma * (1 - dones[s]) * next_vs - values[s]))
    return vs, advantages


def random_rollout(n=5, T=12, seed=0):
    rng = random.Random(seed)
    rewards = torch.tensor([[rng.uniform(-1, 2) for _ in range(T)] for _ in range(n)])
    dones = torch.tensor([[1.0 if rng.random() < 0.2 else 0.0 for _ in range(T)] for _ in range(n)])
    dones[0, T // 2] = 1.0  # at least one episode end inside a rollout
    dones[1, -1] = 1.0  # and one on the last step (bootstrap must be ignored)
    values = torch.tensor([[rng.uniform(-2, 2) for _ in range(T)] for _ in range(n)])
    bootstrap = torch.tensor([rng.uniform(-2, 2) for _ in range(n)])
    return rewards, dones, values, bootstrap


@pytest.mark.parametrize("T", [1, 2, 5, 32, 33])
def test_backward_recurrence_matches_a_loop(T):
    """x_t = a_t + b_t x_{t+1} from x_T: the doubling against the loop it replaces, with b's zeros (episode ends)
    and lengths that are not powers of two."""
    gen = torch.Generator().manual_seed(T)
    a, b = torch.randn(3, T, generator=gen), torch.rand(3, T, generator=gen)
    b[b < 0.2] = 0.0
    last = torch.randn(3, generator=gen)
    expected, x = torch.empty(3, T), last
    for t in reversed(range(T)):
        x = a[:, t] + b[:, t] * x
        expected[:, t] = x
    assert torch.allclose(losses.backward_recurrence(a, b, last), expected, atol=1e-5)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_gae_matches_reference(gamma, lam):
    rewards, dones, values, bootstrap = random_rollout()
    advantages, returns = losses.gae(rewards, dones, values, bootstrap, gamma, lam)
    for i in range(rewards.shape[0]):
        expected = reference_gae(rewards[i].tolist(), dones[i].tolist(), values[i].tolist(),
                                 bootstrap[i].item(), gamma, lam)
        assert advantages[i].tolist() == pytest.approx(expected, abs=1e-5)
    assert torch.allclose(returns, advantages + values)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_turn_gae_matches_the_moves_as_their_own_game(gamma, lam):
    rewards, dones, values, bootstrap = random_rollout(n=40, T=12, seed=4)
    gen = torch.Generator().manual_seed(5)
    acting = (torch.rand(40, 13, generator=gen) < 0.5).float()  # turns alternating or not, runs of waits
    acting[:, 1::2] = torch.where(torch.arange(40)[:, None] < 20, 1.0 - acting[:, ::2][:, :6], acting[:, 1::2])
    truncated = dones * (torch.rand(40, 12, generator=gen) < 0.5).float()
    advantages, targets, known = losses.turn_gae(rewards, dones, truncated, values, bootstrap, acting, gamma, lam)
    for i in range(40):
        expected, expected_known = reference_turn_gae(
            rewards[i].tolist(), dones[i].tolist(), truncated[i].tolist(), values[i].tolist(), bootstrap[i].item(),
            acting[i].tolist(), gamma, lam)
        assert advantages[i].tolist() == pytest.approx(expected, abs=1e-5)
        assert known[i].tolist() == expected_known
    assert torch.allclose(targets, advantages + values)
    assert 0 < known.sum() < acting[:, :-1].sum()  # some moves had no return in sight


def test_turn_gae_with_every_step_acting_is_gae():
    rewards, dones, values, bootstrap = random_rollout(seed=6)
    acting = torch.ones(rewards.shape[0], rewards.shape[1] + 1)
    advantages, targets, known = losses.turn_gae(rewards, dones, torch.zeros_like(dones), values, bootstrap, acting,
                                                 0.99, 0.95)
    expected, expected_targets = losses.gae(rewards, dones, values, bootstrap, 0.99, 0.95)
    assert torch.allclose(advantages, expected, atol=1e-6) and torch.allclose(targets, expected_targets, atol=1e-6)
    assert bool(known.all())


@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (0.5, 0.9), (100.0, 100.0)])
def test_vtrace_matches_reference(rho_bar, c_bar):
    rewards, dones, values, bootstrap = random_rollout(seed=1)
    gen = torch.Generator().manual_seed(3)
    behaviour = -torch.rand(rewards.shape, generator=gen) * 2
    target = -torch.rand(rewards.shape, generator=gen) * 2  # ratios both above and below the clips
    vs, advantages = losses.vtrace(behaviour, target, rewards, dones, values, bootstrap, 0.95, rho_bar, c_bar)
    for i in range(rewards.shape[0]):
        ref_vs, ref_adv = reference_vtrace(behaviour[i].tolist(), target[i].tolist(), rewards[i].tolist(),
                                           dones[i].tolist(), values[i].tolist(), bootstrap[i].item(),
                                           0.95, rho_bar, c_bar)
        assert vs[i].tolist() == pytest.approx(ref_vs, abs=1e-4)
        assert advantages[i].tolist() == pytest.approx(ref_adv, abs=1e-4)


def test_vtrace_on_policy_equals_lambda_one_returns():
    """With identical policies and no clipping V-trace targets are the n-step (GAE lambda=1) returns."""
    rewards, dones, values, bootstrap = random_rollout(seed=2)
    log_probs = torch.zeros_like(rewards)
    vs, _ = losses.vtrace(log_probs, log_probs, rewards, dones, values, bootstrap, 0.9, 1.0, 1.0)
    _, returns = losses.gae(rewards, dones, values, bootstrap, 0.9, 1.0)
    assert torch.allclose(vs, returns, atol=1e-5)


def test_ppo_policy_loss_hand_numbers():
    ratio = torch.tensor([1.5, 0.5, 1.05, 1.5])
    advantages = torch.tensor([2.0, 2.0, -1.0, -1.0])
    # clip e=0.25: range [0.8, 1.25]
    # 1.5*2 vs 1.25*2 -> 2.5 ; 0.5*2 vs 0.8*2 -> 1.0 ; 1.05*-1 vs 1.05*-1 -> -1.05 ; -1.5 vs -1.25 -> -1.5
    expected = -(2.5 + 1.0 - 1.05 - 1.5) / 4
    assert losses.ppo_policy_loss(ratio, advantages, 0.25).item() == pytest.approx(expected)
    mask = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert losses.ppo_policy_loss(ratio, advantages, 0.25, mask).item() == pytest.approx(-(2.5 - 1.5) / 2)


def test_symmetric_clip_range():
    ratio = torch.tensor([10.0, 0.01])
    advantages = torch.tensor([1.0, -1.0])
    # e=0.1 clips to [1/1.1, 1.1]: min(10, 1.1) = 1.1 ; min(-0.01, -1/1.1) = -1/1.1
    assert losses.ppo_policy_loss(ratio, advantages, 0.1).item() == pytest.approx(-(1.1 - 1 / 1.1) / 2)


def test_kl_penalty_estimates_the_kl_of_two_gaussians_from_the_behaviour_policys_actions():
    torch.manual_seed(0)
    behaviour = torch.distributions.Normal(torch.tensor([0.0, 0.5]), torch.tensor([1.0, 0.8]))
    current = torch.distributions.Normal(torch.tensor([0.3, 0.2]), torch.tensor([0.7, 1.1]))
    actions = behaviour.sample((200_000,))
    log_ratio = (current.log_prob(actions) - behaviour.log_prob(actions)).sum(-1)
    exact = torch.distributions.kl_divergence(behaviour, current).sum().item()
    assert losses.kl_penalty(log_ratio).item() == pytest.approx(exact, rel=0.03)
    # Per sample r - 1 - log r: 0 where the policy has not moved, never negative; the mask drops a sample.
    log_ratio = torch.tensor([0.0, math.log(2.0), math.log(0.5)])
    assert losses.kl_penalty(log_ratio).item() == pytest.approx((0 + (1 - math.log(2)) + (-0.5 + math.log(2))) / 3)
    assert losses.kl_penalty(log_ratio, torch.tensor([1.0, 0.0, 0.0])).item() == 0.0


def test_clipped_value_loss_hand_numbers():
    values = torch.tensor([3.0, 0.0, 1.2])
    old_values = torch.tensor([1.0, 0.0, 1.0])
    targets = torch.tensor([3.0, 2.0, 0.0])
    # clip 0.5: clipped values [1.5, 0.0, 1.2]
    # errors: max(0, 2.25)=2.25 ; max(4, 4)=4 ; max(1.44, 1.44)=1.44
    expected = 0.5 * (2.25 + 4.0 + 1.44) / 3
    assert losses.clipped_value_loss(values, old_values, targets, 0.5).item() == pytest.approx(expected)


def test_normalize_respects_mask():
    x = torch.tensor([1.0, 3.0, 100.0])
    out = losses.normalize(x, torch.tensor([1.0, 1.0, 0.0]))
    assert out[:2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-6)


def test_normalize_keeps_a_single_value():
    """One advantage normalised is 0: a minibatch of one move trained its policy on nothing."""
    assert losses.normalize(torch.tensor([2.5])).tolist() == [2.5]
    assert losses.normalize(torch.tensor([2.5, 7.0]), torch.tensor([1.0, 0.0]))[0].item() == 2.5


@pytest.mark.parametrize("bootstrap_truncated", [True, False])
def test_shaped_rewards_scale_clip_and_credit_the_value_at_a_time_limit(bootstrap_truncated):
    rewards = torch.tensor([[1.0, -30.0, 5.0, 2.0]])
    truncated = torch.tensor([[0.0, 0.0, 0.0, 1.0]])  # the time limit cut the episode after step 3
    values = torch.tensor([[0.5, 0.6, 0.7, 4.0]])
    shaped = losses.shaped_rewards(rewards, truncated, values, gamma=0.9, scale=0.5, clip=2.0,
                                   bootstrap_truncated=bootstrap_truncated)
    credit = 0.9 * 4.0 if bootstrap_truncated else 0.0
    assert shaped[0].tolist() == pytest.approx([0.5, -2.0, 2.0, 1.0 + credit])
