"""One APPO training iteration over a batch of whole trajectories: the model, the optimizer and the maths.

No processes, queues or shared memory here: the learner (appo/learning/learner.py) builds the batch and hands it to
`ppo_updates`, which yields each minibatch's statistics (tensors on the model's device). The loss terms themselves
are in appo/learning/losses.py.
A batch holds, per trajectory of T steps: obs [n, T+1, ...] (step T is the bootstrap observation), rnn_states
[n, T+1, H], actions, log_probs and values (the behaviour policy's), rewards and dones [n, T], with more than
one acting id a `mask` [n, T] of the steps this policy took, and with action masks a `policy_mask` [n, T] of those
steps that acted, `acting` [n, T+1] (where the seat was to move) and `truncated` [n, T] (the time limits): a turn-based
game's waiting steps train nothing, `losses.turn_gae` passes them through to the seat's move before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from appo.config.hyperparams import Hyperparams
from appo.learning import losses
from appo.learning.model import ActorCritic

if TYPE_CHECKING:
    from appo.learning.ranks import RankGroup

# A minibatch's statistics (`minibatch_loss`), in the order the learner ranks sum them in.
# `kl` is measured from the policy PPO's clip range is measured from (--proximal_policy), `iteration_kl` from the
# weights the iteration started with, so an asynchronous run's policy lag is not in it (NaN where those weights' log-
# probabilities were not taken: `needs_start_log_probs`).
STATS = ("loss", "policy_loss", "value_loss", "exploration_loss", "entropy", "kl", "iteration_kl", "clip_fraction",
         "values", "value_targets")
# What `train_step` returns for a minibatch, in this order: the statistics, the gradient's norm before clipping, and
# whether the update was applied (1) or skipped because a loss or the gradient was not finite (0).
UPDATE_FIELDS = (*STATS, "grad_norm", "applied")


def select(x: Tensor | dict[str, Tensor], index: Tensor) -> Tensor | dict[str, Tensor]:
    """Rows `index` of a tensor, or of every tensor of an observation dict."""
    if isinstance(x, dict):
        return {key: select(value, index) for key, value in x.items()}
    return x[index]


def replace_nonfinite_(batch: dict[str, Any]) -> int:
    """Set non-finite observations (float keys) and rewards of a batch to 0 in place; returns how many. One host
    sync in all (the count), none per tensor, and no write unless something was not finite."""
    checked = [(tensor, ~torch.isfinite(tensor)) for tensor in [*batch["obs"].values(), batch["rewards"]]
               if tensor.is_floating_point()]
    count = int(torch.stack([bad.sum() for _, bad in checked]).sum()) if checked else 0
    if count:
        for tensor, bad in checked:
            tensor.masked_fill_(bad, 0.0)
    return count


def forward_trajectories(model: ActorCritic, recurrence: int, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """Action params [n, T, ...] and values [n, T] of whole trajectories, cut into chunks of `recurrence` steps.

    Each chunk starts from the RNN state the actor recorded at that step, so back-propagation runs
    over at most `recurrence` steps; episode ends inside a chunk reset the state as during collection.
    """
    dones = batch["dones"]
    n, length = dones.shape
    chunks = n * length // recurrence
    params, values = model.forward_sequence(
        {key: obs[:, :-1].reshape(chunks, recurrence, *obs.shape[2:]) for key, obs in batch["obs"].items()},
        batch["rnn_states"][:, :-1:recurrence].reshape(chunks, -1),
        dones.reshape(chunks, recurrence),
    )
    return params.reshape(n, length, -1), values.reshape(n, length)


@torch.no_grad()
def bootstrap_values(model: ActorCritic, batch: dict[str, Any]) -> Tensor:
    """Value [n] of the observation after each trajectory's last step, under the current weights.

    Every other step already has its value from inference (the behaviour value, which is what PPO's
    GAE and value clipping use), so only these 1/T of the observations need a forward pass here.
    """
    last_obs = {key: obs[:, -1:] for key, obs in batch["obs"].items()}
    no_done = torch.zeros_like(batch["dones"][:, :1])
    _, bootstrap = model.forward_sequence(last_obs, batch["rnn_states"][:, -1], no_done)
    return bootstrap[:, 0]


def needs_start_log_probs(cfg: Any) -> bool:
    """Whether an iteration takes its samples' log-probabilities under its starting weights (`start_log_probs`): the
    policy --proximal_policy=iteration measures the clip range from, and --lr_schedule=kl_adaptive its KL. The KL is
    measured in each minibatch's forward pass, before its step, so an iteration of one update (one pass of one
    minibatch, as images train) would measure 0 and leave the rate where it is: kl_adaptive skips that pass there."""
    one_update = cfg.ppo_epochs == 1 and cfg.num_batches_per_iteration == 1
    return cfg.proximal_policy == "iteration" or (cfg.lr_schedule == "kl_adaptive" and not one_update)


@torch.no_grad()
def start_log_probs(model: ActorCritic, recurrence: int, batch: dict[str, Any]) -> Tensor:
    """Log-probabilities [n, T] of the batch's actions under the current weights, taken once at the start of an
    iteration (one more forward pass over its samples)."""
    params, _ = forward_trajectories(model, recurrence, batch)
    return model.distribution(params).log_prob(batch["actions"])


def train_step(model: ActorCritic, optimizer: torch.optim.Optimizer, cfg: Any, hp: Hyperparams,
               mb: dict[str, Any], advantages: Tensor | None, targets: Tensor | None,
               ranks: RankGroup | None = None) -> Tensor:
    """One minibatch of APPO: forward, losses, backward, clipped Adam step. Returns a tensor of `UPDATE_FIELDS` on the
    model's device, read by the learner once an iteration: nothing here waits for the device (no host sync), so a GPU
    runs ahead of Python. When the loss or the gradient is not finite, nothing changes (weights, optimizer, return
    statistics): the optimizer skips the step on the device (`apply_gradients`) and `applied` is 0.

    `mb` holds whole trajectories [n, T]; `values` are the behaviour values stored by inference (the
    old values of PPO's value clipping) and `bootstrap` the value after the last step. With GAE the
    advantages and targets are precomputed; with V-trace they are computed here from the current
    policy's log-probabilities. `cfg` gives the run's fixed flags, `hp` the policy's current hyper-parameters.

    With `ranks` (--learner_processes_per_policy > 1, GAE only) every rank holds the whole minibatch: advantages are
    normalised over all of it, then each rank computes the loss of its share, weighted by the share's part of the
    minibatch, and the gradients are summed over the ranks (appo/learning/ranks.py), and so are the statistics, each a
    (masked) mean, weighted alike: every rank returns the whole minibatch's, even one whose share is empty (fewer
    trajectories than ranks), which adds nothing.
    """
    whole_mask, whole_targets, weight = mb.get("mask"), targets, 1.0
    if cfg.normalize_advantage and not cfg.with_vtrace:
        advantages = losses.normalize(advantages, mb.get("policy_mask", whole_mask))
    if ranks is not None:
        rows = ranks.share(len(mb["dones"]))
        weight = share_weight(mb["dones"], whole_mask, rows)
        mb = {name: select(tensor, rows) for name, tensor in mb.items()}
        advantages, targets = advantages[rows], targets[rows]
    loss, stats = None, {}
    if len(mb["dones"]):
        loss, targets, stats = minibatch_loss(model, cfg, hp, mb, advantages, targets)
        if cfg.with_vtrace:  # its targets come from the loss (one rank only: appo/config/checks.py)
            whole_targets = targets
    grad_norm, applied, stats = apply_gradients(model, optimizer, loss, weight, hp.max_grad_norm, ranks, stats)
    # Used from the next step on; every rank folds in the whole minibatch's targets.
    model.update_return_stats(whole_targets if whole_mask is None else whole_targets[whole_mask > 0], applied)
    return torch.stack([*(stats[name].float() for name in STATS), grad_norm.float(), applied.float()])


def minibatch_loss(model: ActorCritic, cfg: Any, hp: Hyperparams, mb: dict[str, Any], advantages: Tensor | None,
                   targets: Tensor | None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The APPO loss of a minibatch (or of a rank's share of one), the value targets it used (V-trace's, computed here
    from the current policy's log-probabilities), and its statistics. Values are in reward units throughout; the
    value loss alone is taken in the value head's units, which differ under --normalize_returns."""
    params, values = forward_trajectories(model, cfg.recurrence, mb)
    dist = model.distribution(params)
    log_probs = dist.log_prob(mb["actions"])
    start = mb.get("start_log_probs")
    proximal = start if cfg.proximal_policy == "iteration" else None
    log_ratio = log_probs - (mb["log_probs"] if proximal is None else proximal)
    ratio = torch.exp(log_ratio)
    mask = mb.get("mask")  # the steps that train the value head
    acted = mb.get("policy_mask", mask)  # and those that train the policy
    if proximal is not None:  # the surrogate's expectation is over the behaviour policy's actions
        advantages = advantages * torch.exp(proximal - mb["log_probs"])
    if cfg.with_vtrace:
        targets, advantages = losses.vtrace(
            mb["log_probs"], log_probs.detach(), mb["rewards"], mb["dones"], values.detach(), mb["bootstrap"],
            hp.gamma, cfg.vtrace_rho, cfg.vtrace_c)
        if cfg.normalize_advantage:
            advantages = losses.normalize(advantages, acted)

    policy_loss = losses.ppo_policy_loss(ratio, advantages, hp.ppo_clip_ratio, acted)
    norm = model.normalize_values
    value_loss = losses.clipped_value_loss(norm(values), norm(mb["values"]), norm(targets), hp.ppo_clip_value, mask)
    entropy = losses.masked_mean(dist.entropy(), acted)
    if cfg.exploration_loss == "entropy":
        exploration_loss = -entropy
    else:
        exploration_loss = losses.masked_mean(dist.symmetric_kl_to_prior(), acted)
    loss = policy_loss + hp.value_loss_coeff * value_loss + hp.exploration_loss_coeff * exploration_loss
    kl_loss = losses.kl_penalty(log_ratio, acted)
    if cfg.kl_loss_coeff > 0:
        loss = loss + cfg.kl_loss_coeff * kl_loss

    with torch.no_grad():
        low, high = 1.0 / (1.0 + hp.ppo_clip_ratio), 1.0 + hp.ppo_clip_ratio
        stats = {
            "loss": loss,
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "exploration_loss": exploration_loss,
            "entropy": entropy,
            "kl": kl_loss,
            "iteration_kl": (losses.kl_penalty(log_probs - start, acted) if start is not None
                             else torch.full((), float("nan"), device=log_probs.device)),
            "clip_fraction": losses.masked_mean(((ratio < low) | (ratio > high)).float(), acted),
            "values": losses.masked_mean(values, mask),
            "value_targets": losses.masked_mean(targets, mask),
        }
    return loss, targets, stats


def apply_gradients(model: ActorCritic, optimizer: torch.optim.Optimizer, loss: Tensor | None, weight: float,
                    max_grad_norm: float, ranks: RankGroup | None, stats: dict[str, Tensor]
                    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Backward `loss` x `weight` (None: this rank has no share of the minibatch), sum the gradients over the ranks,
    clip them and take the Adam step; returns the gradient's norm before clipping, whether the step was applied (a
    0-dim bool tensor: False when a loss or the gradient was not finite, on any rank; then the weights and the
    optimizer's state are as they were), and the minibatch's statistics: `stats` as they are (zeros for a rank with
    no share), or with ranks their sum over the ranks, each weighted by `weight`.

    The optimizer is the fused Adam of `appo.learning.policy.make_optimizer`: its `found_inf` makes the skip a
    decision on the device, where a Python `if` would wait for the GPU at every minibatch."""
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    if not stats:
        stats = {name: torch.zeros((), device=device) for name in STATS}
    finite = torch.ones((), dtype=torch.bool, device=device)
    if loss is not None:
        finite = torch.isfinite(loss)
        (loss * weight).backward()
    if ranks is not None:
        finite, summed = ranks.sum_gradients(model, finite, torch.stack([stats[name] for name in STATS]) * weight)
        stats = dict(zip(STATS, summed))
    grad_norm = clip_gradients(model, max_grad_norm)
    applied = finite & torch.isfinite(grad_norm)
    optimizer.found_inf = (~applied).float()
    optimizer.step()
    return grad_norm, applied, stats


def share_weight(dones: Tensor, mask: Tensor | None, rows: slice) -> float:
    """The part of a minibatch's steps (its masked steps, with a mask) that `rows` hold."""
    if mask is None:
        return len(dones[rows]) / len(dones)
    return float(mask[rows].sum() / mask.sum().clamp(min=1.0))


def clip_gradients(model: ActorCritic, max_grad_norm: float) -> Tensor:
    """The gradient's norm before clipping; with `max_grad_norm` > 0 the gradient is scaled down to at most that."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else float("inf"))


def single_steps(batch: dict[str, Any], advantages: Tensor, targets: Tensor, rows: Tensor
                 ) -> tuple[dict[str, Any], Tensor, Tensor]:
    """The steps `rows` [n, T] of a batch as trajectories of one step each, with their advantages and targets: the
    steps that train, which are then every step of the batch (no `mask` or `policy_mask`). A feed-forward model needs
    no step's neighbours once GAE is done: a turn-based game's waiting steps, half its steps, then cost the learner
    nothing, and --minibatch_unit=step draws minibatches of single steps. Each one-step trajectory's second observation
    repeats its first (a view): the layout wants T+1, and nothing reads it after `bootstrap_values`."""

    def one_step(x: Tensor) -> Tensor:
        return x[rows].unsqueeze(1)

    def with_next(x: Tensor) -> Tensor:
        taken = x[:, :-1][rows]
        return taken.unsqueeze(1).expand(len(taken), 2, *taken.shape[1:])

    steps = {name: one_step(x) for name, x in batch.items()
             if name not in ("obs", "rnn_states", "bootstrap", "mask", "policy_mask")}
    steps["obs"] = {key: with_next(obs) for key, obs in batch["obs"].items()}
    steps["rnn_states"] = with_next(batch["rnn_states"])
    return steps, one_step(advantages), one_step(targets)


def advantages_and_targets(cfg: Any, hp: Hyperparams, batch: dict[str, Any], values: Tensor, acting: Tensor | None,
                           truncated: Tensor | None) -> tuple[dict[str, Any], Tensor, Tensor]:
    """GAE's advantages and value targets from `values` [n, T] and the batch's `bootstrap` [n], and the batch the
    passes train on: whole trajectories, or with --minibatch_unit=step (a feed-forward model) the steps this policy
    took, one by one (`single_steps`). With action masks (`acting`, `truncated`) GAE runs over each seat's own moves
    (`losses.turn_gae`), only the moves with a known return train, the value head included, and a feed-forward model
    trains on those moves alone."""
    if acting is None:
        advantages, targets = losses.gae(batch["rewards"], batch["dones"], values, batch["bootstrap"], hp.gamma,
                                         hp.gae_lambda)
        if cfg.minibatch_unit == "step":  # feed-forward only (appo/config/checks.py)
            own = batch["mask"] > 0 if "mask" in batch else torch.ones_like(batch["dones"], dtype=torch.bool)
            return single_steps(batch, advantages, targets, own)
        return batch, advantages, targets
    advantages, targets, known = losses.turn_gae(batch["rewards"], batch["dones"], truncated, values,
                                                 batch["bootstrap"], acting, hp.gamma, hp.gae_lambda)
    moves = batch["policy_mask"] * known
    if cfg.recurrence == 1:
        return single_steps(batch, advantages, targets, moves > 0)
    return {**batch, "mask": moves, "policy_mask": moves}, advantages, targets


@torch.no_grad()
def current_values(model: ActorCritic, recurrence: int, batch: dict[str, Any]) -> Tensor:
    """Values [n, T] of the batch's steps under the current weights: what --recompute_advantages takes GAE from at
    the start of every pass, where the stored values are the behaviour policy's, up to --max_policy_lag versions
    old, and older still after the first pass."""
    return forward_trajectories(model, recurrence, batch)[1]


def ppo_updates(model: ActorCritic, optimizer: torch.optim.Optimizer, cfg: Any, hp: Hyperparams,
                batch: dict[str, Any], shuffle: torch.Generator | None = None,
                another_epoch: Callable[[], bool] | None = None,
                ranks: RankGroup | None = None) -> Iterator[tuple[int, Tensor]]:
    """One training iteration over `batch`: fold its observations into the normalisation statistics, value the
    bootstrap observations, compute GAE (`advantages_and_targets`; V-trace is computed per minibatch, in
    `train_step`), then up to --ppo_epochs passes over min(--num_batches_per_iteration, n) random minibatches of whole
    trajectories (of single steps with --minibatch_unit=step, and of single moves in a turn-based game). Yields each
    minibatch's pass (0 for the first) and `UPDATE_FIELDS` (`train_step`) right after its step. `shuffle` draws the
    minibatches (torch's global generator when None); `another_epoch`, asked after every pass but the last, ends the
    iteration early when it returns False (the first pass always runs). With `ranks`, rank 0 decides the passes and
    draws the minibatches for every rank, and each minibatch is shared out (`train_step`)."""
    model.update_obs_stats({key: obs[:, :-1] for key, obs in batch["obs"].items()})
    batch["bootstrap"] = bootstrap_values(model, batch)
    acting, truncated = batch.pop("acting", None), batch.pop("truncated", None)
    trained, advantages, targets = batch, None, None
    if not cfg.with_vtrace:
        values = current_values(model, cfg.recurrence, batch) if cfg.recompute_advantages else batch["values"]
        trained, advantages, targets = advantages_and_targets(cfg, hp, batch, values, acting, truncated)
    n = trained["rewards"].shape[0]
    if n == 0:  # no step with a known return: a short --rollout of a turn-based game, where every move's next turn
        return  # lies in the next trajectory
    # Taken over the steps that train only: a turn-based game's waiting steps and a snapshot's seat, half or more of
    # its batch, would cost a forward pass each and be read by nothing.
    start = start_log_probs(model, cfg.recurrence, trained) if needs_start_log_probs(cfg) else None
    if start is not None:  # --proximal_policy=iteration is GAE only (appo/config/checks.py)
        trained["start_log_probs"] = start
    num_minibatches = min(cfg.num_batches_per_iteration, n)
    for epoch in range(cfg.ppo_epochs):
        go_on = epoch == 0 or another_epoch is None or another_epoch()
        order = None
        if go_on and (ranks is None or ranks.rank == 0):
            order = torch.randperm(n, generator=shuffle, device=trained["rewards"].device)
        if ranks is not None:
            go_on, order = ranks.agree_on_pass(go_on, order, n)
        if not go_on:
            return
        if epoch > 0 and cfg.recompute_advantages:  # GAE only (appo/config/checks.py)
            batch["bootstrap"] = bootstrap_values(model, batch)
            values = current_values(model, cfg.recurrence, batch)
            trained, advantages, targets = advantages_and_targets(cfg, hp, batch, values, acting, truncated)
            if start is not None:
                trained["start_log_probs"] = start
        for mb_index in order.chunk(num_minibatches):
            mb = {name: select(tensor, mb_index) for name, tensor in trained.items()}
            yield epoch, train_step(model, optimizer, cfg, hp, mb, None if advantages is None else advantages[mb_index],
                                    None if targets is None else targets[mb_index], ranks)
