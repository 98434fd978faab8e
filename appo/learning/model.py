"""Actor-critic model built from the spaces: encoders, optional GRU/LSTM core, policy and value heads.

Inference calls `forward_step` on a batch of single steps; the learner calls `forward_sequence` on
trajectories cut into chunks of `--recurrence` steps, resetting the recurrent state after episode ends
exactly as the actors did while collecting. Observations are dicts of tensors (see `appo.spaces`).

Custom encoders: `register_encoder("name", factory)` where `factory(space, cfg)` returns an `nn.Module`
with an `out_size` attribute, mapping a float tensor [batch, *space.shape] to [batch, out_size]; then
`--encoder=name`. Register it in a module imported before the trainer starts (workers are forked, so
they inherit the registration), or pass `--encoder=package.module:factory`.
"""

from __future__ import annotations

import copy
import importlib
import math
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from appo.config.encoders import AUTO, IMPALA_RESNET, MLP, NATURE_CNN, REGISTERED, SMALL_CNN
from appo.memory.buffers import rnn_size
from appo.spaces import (
    MASK_KEY,
    action_spec,
    channels_last,
    gaussian_box,
    image_side,
    initial_stds,
    key_encoder,
    masks_actions,
    mirror_axes,
    obs_spaces,
)

ObsDict = dict[str, Tensor]
LOG_STD_BOUNDS = (-5.0, 2.0)  # a Gaussian's log-std is clamped to these when sampled and scored
# A disallowed action's logit: minus infinity in effect (its probability is exactly 0 after the softmax), but finite,
# so that the entropy's p * log p stays 0 rather than 0 * -inf = nan.
MASKED_LOGIT = torch.finfo(torch.float32).min


def masked_logits(logits: Tensor, mask: Tensor, sizes: list[int]) -> Tensor:
    """`logits` [..., sum(sizes)] with the actions `mask` (same shape, 0/1) does not allow set to MASKED_LOGIT, part by
    part (`sizes`: choices per part). A part whose mask allows nothing is left as it is: that row is a seat waiting
    for its turn (appo/envs/pettingzoo_turns.py), which does not act and trains nothing."""
    parts = (mask > 0).split(sizes, dim=-1)
    allowed = torch.cat([part | ~part.any(dim=-1, keepdim=True) for part in parts], dim=-1)
    return logits.masked_fill(~allowed, MASKED_LOGIT)


# ---------------------------------------------------------------------------------------------- actions
class ActionDistribution:
    """Product of categorical parts (Discrete, MultiDiscrete) and diagonal Gaussian parts (Box).

    `params` [..., P] hold, part after part, n logits per discrete part and d means + d log-stds per
    Gaussian part. Actions [..., A] hold one integer per discrete part and d floats per Gaussian part
    (a Discrete space's actions have no last dimension). `centre`: the action box's centre per Gaussian dimension,
    where symmetric_kl_to_prior centres its prior (None: 0). `masked`: the logits may hold MASKED_LOGIT (masked_logits).
    """

    def __init__(self, params: Tensor, spec: list[tuple[str, int]], scalar_action: bool, centre: Tensor | None = None,
                 masked: bool = False):
        self.spec, self.scalar_action, self.centre, self.masked = spec, scalar_action, centre, masked
        self.parts: list[tuple[str, Tensor, Tensor | None]] = []
        offset = 0
        for kind, n in spec:
            if kind == "discrete":
                self.parts.append((kind, torch.log_softmax(params[..., offset:offset + n], dim=-1), None))
                offset += n
            else:
                mean = params[..., offset:offset + n]
                log_std = params[..., offset + n:offset + 2 * n].clamp(*LOG_STD_BOUNDS)
                self.parts.append((kind, mean, log_std))
                offset += 2 * n

    def _action_parts(self, actions: Tensor) -> list[Tensor]:
        if self.scalar_action:
            return [actions]
        chunks, offset = [], 0
        for kind, n in self.spec:
            width = 1 if kind == "discrete" else n
            chunk = actions[..., offset:offset + width]
            chunks.append(chunk[..., 0] if kind == "discrete" else chunk)
            offset += width
        return chunks

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        samples = []
        for kind, a, log_std in self.parts:
            if kind == "discrete":
                # Inverse CDF with one uniform per row: a fraction of torch.multinomial's cost on small batches.
                uniform = torch.rand((*a.shape[:-1], 1), generator=generator, device=a.device)
                choice = (a.exp().cumsum(-1) < uniform).sum(-1, keepdim=True).clamp(max=a.shape[-1] - 1)
                if self.masked:  # a uniform of 0, or above the rounded total, must not land on a disallowed edge
                    choice = choice.clamp(*_allowed_range(a))
                samples.append(choice.float())
            else:
                noise = torch.randn(a.shape, generator=generator, device=a.device)
                samples.append(a + log_std.exp() * noise)
        if self.scalar_action:
            return samples[0][..., 0].long()
        return torch.cat(samples, dim=-1)

    def mode(self) -> Tensor:
        """The most likely action: the argmax of each discrete part, the mean of each Gaussian part."""
        parts = [a.argmax(-1, keepdim=True).float() if kind == "discrete" else a for kind, a, _ in self.parts]
        if self.scalar_action:
            return parts[0][..., 0].long()
        return torch.cat(parts, dim=-1)

    def log_prob(self, actions: Tensor) -> Tensor:
        total = 0.0
        for (kind, a, log_std), action in zip(self.parts, self._action_parts(actions)):
            if kind == "discrete":
                total = total + a.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            else:
                z = (action - a) / log_std.exp()
                total = total + (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return total

    def entropy(self) -> Tensor:
        total = 0.0
        for kind, a, log_std in self.parts:
            if kind == "discrete":
                total = total - (a.exp() * a).sum(-1)
            else:
                total = total + (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)
        return total

    def symmetric_kl_to_prior(self) -> Tensor:
        """KL(pi || prior) + KL(prior || pi); the prior is uniform (discrete) or N(box centre, 1) per dim (Gaussian):
        the mean starts at the centre, which is no departure from the prior."""
        total, gaussian_offset = 0.0, 0
        for kind, a, log_std in self.parts:
            if kind == "discrete":
                if self.masked:  # the prior is uniform over the allowed actions
                    allowed = a > MASKED_LOGIT / 2
                    n = allowed.sum(-1, keepdim=True).float()
                    log_uniform = -torch.log(n)
                    total = total + (a.exp() * (a - log_uniform)).sum(-1) + \
                        torch.where(allowed, (log_uniform - a) / n, 0.0).sum(-1)
                    continue
                n = a.shape[-1]
                log_uniform = -math.log(n)
                total = total + (a.exp() * (a - log_uniform)).sum(-1) + ((log_uniform - a) / n).sum(-1)
            else:
                n = a.shape[-1]
                mean = a if self.centre is None else a - self.centre[gaussian_offset:gaussian_offset + n]
                gaussian_offset += n
                var, mean_sq = (2 * log_std).exp(), mean.pow(2)
                kl_pi_prior = 0.5 * (var + mean_sq - 1.0) - log_std
                kl_prior_pi = 0.5 * ((1.0 + mean_sq) / var - 1.0) + log_std
                total = total + (kl_pi_prior + kl_prior_pi).sum(-1)
        return total


def _allowed_range(log_probs: Tensor) -> tuple[Tensor, Tensor]:
    """The first and last allowed action of each row [..., 1] (masked actions' log-probabilities are near
    MASKED_LOGIT)."""
    allowed = log_probs > MASKED_LOGIT / 2
    index = torch.arange(log_probs.shape[-1], device=log_probs.device).expand_as(log_probs)
    last = torch.where(allowed, index, -1).amax(-1, keepdim=True)
    first = torch.where(allowed, index, log_probs.shape[-1]).amin(-1, keepdim=True)
    return first, last


# ---------------------------------------------------------------------------------------------- encoders
def _linear(in_size: int, out_size: int, gain: float) -> nn.Linear:
    layer = nn.Linear(in_size, out_size)
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


class Tanh(nn.Module):
    """tanh. Without autograd (inference, the learner's bootstrap values) a CPU input of at least
    FAST_TANH_MIN_ELEMENTS is computed as 2 sigmoid(2x) - 1 in place, within 2e-7 of torch.tanh: torch's CPU tanh
    costs about 0.13 us an element on this project's machines, against 0.025 for that form (docs/PERFORMANCE.md,
    "Batched sampling"); below that size the form's four calls cost more than tanh's one. An export's trace takes
    tanh, whose graph holds for any batch size."""

    def forward(self, x: Tensor) -> Tensor:
        # is_tracing first: under a trace, x.numel() is a traced value whose comparison warns
        if torch.jit.is_tracing() or x.requires_grad or x.numel() < FAST_TANH_MIN_ELEMENTS or x.device.type != "cpu":
            return torch.tanh(x)
        return (x * 2).sigmoid_().mul_(2).sub_(1)


FAST_TANH_MIN_ELEMENTS = 4096


class MlpEncoder(nn.Module):
    """Vectors (any shape, flattened) -> --mlp_layers tanh layers of --hidden_size units."""

    def __init__(self, space: gym.spaces.Box, cfg):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        size = int(math.prod(space.shape))
        for _ in range(cfg.mlp_layers):
            layers += [_linear(size, cfg.hidden_size, math.sqrt(2)), Tanh()]
            size = cfg.hidden_size
        self.net = nn.Sequential(*layers)
        self.out_size = size
        self.scalar = space.shape == ()  # a Box of shape (): a batch of it is [B], one column

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.unsqueeze(1) if self.scalar else x)


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int, padding: int = 0) -> nn.Conv2d:
    """Orthogonal init with ReLU's gain: PyTorch's default init shrinks activations at every layer, and
    after three of them Atari frames that differ in a few pixels (ball, paddle) give near-identical
    features, from which the policy cannot learn anything state-dependent."""
    layer = nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=padding)
    nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
    nn.init.zeros_(layer.bias)
    return layer


def _in_channels(space: gym.spaces.Box) -> int:
    if len(space.shape) == 2:  # grey [H, W]
        return 1
    return space.shape[-1] if channels_last(tuple(space.shape)) else space.shape[0]


class _ConvEncoder(nn.Module):
    """Images [C, H, W] (or [H, W, C], as `appo.spaces.channels_last` reads the shape, or grey [H, W]) -> features."""

    def __init__(self, space: gym.spaces.Box, convs: nn.Module, out_size: int):
        super().__init__()
        shape = tuple(space.shape)
        self.grey = len(shape) == 2
        self.channels_last = not self.grey and channels_last(shape)
        chw = (1, *shape) if self.grey else (shape[2], shape[0], shape[1]) if self.channels_last else shape
        self.convs = convs
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *chw)).flatten(1).shape[1]
        self.fc = nn.Sequential(nn.Flatten(), _linear(flat, out_size, math.sqrt(2)), nn.ReLU())
        self.out_size = out_size

    def forward(self, x: Tensor) -> Tensor:
        if self.grey:
            x = x.unsqueeze(1)
        elif self.channels_last:
            x = x.permute(0, 3, 1, 2)
        if torch.is_grad_enabled():
            # NHWC memory order: CPU convolutions (oneDNN) train 1.4x faster on it; inference is 5% slower.
            x = x.contiguous(memory_format=torch.channels_last)
        return self.fc(self.convs(x))


class NatureCnn(_ConvEncoder):
    """The DQN Nature paper's three conv layers and a 512-unit layer."""

    def __init__(self, space: gym.spaces.Box, cfg):
        convs = nn.Sequential(
            _conv(_in_channels(space), 32, 8, stride=4), nn.ReLU(),
            _conv(32, 64, 4, stride=2), nn.ReLU(),
            _conv(64, 64, 3, stride=1), nn.ReLU(),
        )
        super().__init__(space, convs, 512)


class SmallCnn(_ConvEncoder):
    """Images too small for the Nature CNN (e.g. 10x10 grids): padded 3x3 convolutions, the second with stride 2, so
    any size down to 1x1 fits; the third with stride 2 as well where the image is SMALL_CNN_SECOND_STRIDE pixels a
    side or more, so that the layer after them sees a map of at most 10x10 (a 32x32 image gave it 16x16x64 inputs:
    8.4M weights, five times the Nature CNN's layer); the grids below that size keep their network."""

    def __init__(self, space: gym.spaces.Box, cfg):
        side = image_side(tuple(space.shape))
        convs = nn.Sequential(
            _conv(_in_channels(space), 32, 3, stride=1, padding=1), nn.ReLU(),
            _conv(32, 64, 3, stride=2, padding=1), nn.ReLU(),
            _conv(64, 64, 3, stride=2 if side >= SMALL_CNN_SECOND_STRIDE else 1, padding=1), nn.ReLU(),
        )
        super().__init__(space, convs, 512)


SMALL_CNN_SECOND_STRIDE = 20


class _ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), channels and size unchanged."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv2(torch.relu(self.conv1(torch.relu(x))))


class ImpalaResnet(_ConvEncoder):
    """A small IMPALA-style ResNet: three stages of conv + max-pool + two residual blocks (16, 32, 32)."""

    def __init__(self, space: gym.spaces.Box, cfg):
        channels = _in_channels(space)
        stages: list[nn.Module] = []
        for out_channels in (16, 32, 32):
            stages += [nn.Conv2d(channels, out_channels, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       _ResidualBlock(out_channels), _ResidualBlock(out_channels)]
            channels = out_channels
        super().__init__(space, nn.Sequential(*stages, nn.ReLU()), 256)


# The built-in encoders by their names, which appo/config/encoders.py keeps torch-free for the checks of --encoder.
ENCODERS: dict[str, Callable[[gym.spaces.Box, object], nn.Module]] = {
    MLP: MlpEncoder, NATURE_CNN: NatureCnn, SMALL_CNN: SmallCnn, IMPALA_RESNET: ImpalaResnet,
}


def register_encoder(name: str, factory: Callable[[gym.spaces.Box, object], nn.Module]) -> None:
    """Make `--encoder=name` build `factory(space, cfg)` for every observation key. The name is kept with the other
    encoder names (appo/config/encoders.REGISTERED), where the runner checks --encoder without torch."""
    REGISTERED[name] = factory


def encoder_factory(name: str, space: gym.spaces.Box) -> Callable[[gym.spaces.Box, object], nn.Module]:
    encoders = ENCODERS | REGISTERED  # a registered name replaces a built-in one of the same name
    name = key_encoder(name, space)
    if name in encoders:
        return encoders[name]
    if ":" in name:
        module, attribute = name.split(":", 1)
        return getattr(importlib.import_module(module), attribute)  # importlib: the user's --encoder=module:factory
    raise ValueError(f"--encoder={name}: unknown; use {AUTO}, {', '.join(encoders)} or package.module:factory")


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


class RunningNorm(nn.Module):
    """Running mean/std of an observation key or of the value targets, kept as buffers so they travel
    with the weights.

    Only the learner updates them (from each training batch); inference receives them with every
    published weight version, so both normalise identically. Observations are clipped to +-`clip` std.
    """

    def __init__(self, shape: tuple[int, ...], clip: float | None = 5.0):
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(1e-4))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Fold the rows of x in; none (a minibatch whose moves have no known return yet) leaves the stats as they
        were, where the mean of no rows would make them NaN."""
        x = x.reshape(-1, *self.mean.shape).float()
        if x.shape[0] == 0:
            return
        batch_mean, batch_var, batch_count = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        total = self.count + batch_count
        delta = batch_mean - self.mean
        self.mean += delta * batch_count / total
        self.var.copy_((self.var * self.count + batch_var * batch_count + delta.pow(2) * self.count * batch_count
                        / total) / total)
        self.count.copy_(total)
        # Values past 1.8e19 square past float32: kept finite, such inputs normalise to the clip, not to NaN weights.
        self.mean.clamp_(-FLOAT32_MAX, FLOAT32_MAX)
        self.var.clamp_(max=FLOAT32_MAX)

    def std(self) -> Tensor:
        return torch.sqrt(self.var + 1e-8)

    def forward(self, x: Tensor) -> Tensor:
        normalized = (x - self.mean) / self.std()
        return normalized if self.clip is None else normalized.clamp(-self.clip, self.clip)

    def denormalize(self, x: Tensor) -> Tensor:
        return x * self.std() + self.mean


class _Bf16Copy:
    """A bfloat16 copy of an image encoder, its conv weights in NHWC order, for forward passes without autograd
    (inference workers, the learner's bootstrap values). Autocast casts every weight again at every call (the Nature
    CNN's 1.7M floats); the copy casts them once per weight version: 1.3-1.6x faster at 8 observations, 1.1-1.35x at
    32 (scripts/bench_cnn.py; NHWC gave Doom's 72x128 frames 10% of that, Breakout's none). It is refreshed whenever
    a parameter or buffer of the encoder changed (in place: its version counter; replaced: its storage), and runs in
    the encoder's train or eval mode, module by module, so it computes what autocast computes: the same bfloat16
    roundings, with a user encoder's BatchNorm statistics as they are now. (In train mode, a BatchNorm's passes through
    the copy update the copy's statistics, not the encoder's.)"""

    def __init__(self, source: nn.Module):
        self.source = source
        self.module: nn.Module | None = None
        self.seen: list[tuple[int, int]] = []

    def __call__(self, x: Tensor) -> Tensor:
        state = [*self.source.parameters(), *self.source.buffers()]
        seen = [(t.data_ptr(), t._version) for t in state]
        if seen != self.seen:
            with torch.inference_mode(False), torch.no_grad():  # normal tensors, updatable in and out of that mode
                if self.module is None or [ptr for ptr, _ in seen] != [ptr for ptr, _ in self.seen]:
                    self.module = copy.deepcopy(self.source).to(torch.bfloat16).requires_grad_(False)
                    self.module.to(memory_format=torch.channels_last)
                else:
                    for target, tensor in zip([*self.module.parameters(), *self.module.buffers()], state):
                        target.copy_(tensor)
            self.seen = seen
        for target, module in zip(self.module.modules(), self.source.modules()):
            target.training = module.training
        return self.module(x.to(torch.bfloat16)).float()


class ObsEncoder(nn.Module):
    """One encoder per observation key, features concatenated. uint8 images are scaled to [0, 1]."""

    def __init__(self, obs_space: gym.Space, cfg):
        super().__init__()
        spaces = obs_spaces(obs_space)
        self.encoders = nn.ModuleDict({key: encoder_factory(cfg.encoder, s)(s, cfg) for key, s in spaces.items()})
        self.images = {key for key, s in spaces.items() if np.dtype(s.dtype) == np.uint8}
        self.out_size = sum(e.out_size for e in self.encoders.values())
        self.bf16_images = False  # --learner_bf16 in the learner, --inference_bf16 in inference workers
        # Not submodules: no part of the state dict, the published weights or the optimizer.
        self.bf16_copies = {key: _Bf16Copy(self.encoders[key]) for key in self.images}

    def forward(self, obs: ObsDict, norms: nn.ModuleDict | None) -> Tensor:
        features = []
        for key, encoder in self.encoders.items():
            x = obs[key].float()
            if key in self.images:
                x = x / 255.0
                if self.bf16_images and x.device.type == "cpu":  # the encoder in bfloat16, its features float32
                    if not torch.is_grad_enabled():
                        features.append(self.bf16_copies[key](x))
                        continue
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        features.append(encoder(x).float())
                    continue
            elif norms is not None:
                x = norms[key](x)
            features.append(encoder(x))
        return features[0] if len(features) == 1 else torch.cat(features, dim=-1)


# ---------------------------------------------------------------------------------------------- model
class ActorCritic(nn.Module):
    """Encoder (+ core) shared by the policy and value heads, or one of each (--actor_critic_share_weights)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg):
        super().__init__()
        self.spec = action_spec(action_space)
        self.scalar_action = isinstance(action_space, gym.spaces.Discrete)
        self.use_rnn, self.rnn_type = cfg.use_rnn, cfg.rnn_type
        self.shared = cfg.actor_critic_share_weights
        # --action_mask: the policy head masks its logits with the mask key (masked_logits), which is also encoded like
        # any other: a turn-based game's seat must see whether it is its turn, or its value mixes both sides' targets.
        self.masked = masks_actions(cfg.action_mask, obs_space)
        # --mirror_symmetry: per observation key, the axis of its space the left-right mirror reverses.
        self.mirror_axes = mirror_axes(obs_space, action_space) if cfg.mirror_symmetry else None
        spaces = obs_spaces(obs_space)
        self.obs_norms = None
        if cfg.normalize_input:
            self.obs_norms = nn.ModuleDict({key: RunningNorm(tuple(s.shape)) for key, s in spaces.items()
                                            if np.dtype(s.dtype) != np.uint8})
        self.trunks = nn.ModuleList([self._trunk(obs_space, cfg) for _ in range(1 if self.shared else 2)])
        size = cfg.hidden_size if cfg.use_rnn else self.trunks[0]["encoder"].out_size
        self.policy_head = _linear(size, sum(n for _, n in self.spec), 0.01)
        # The Gaussian starts at the action box's centre (an offset of its means, computed from the space: no part of
        # the state dict, so checkpoints of either kind load), each dimension's std capped by the box.
        centre, half_width = gaussian_box(action_space)
        initial_log_std = [math.log(std) for std in initial_stds(cfg.initial_stddev, half_width)]
        self.log_std = nn.Parameter(torch.tensor(initial_log_std).clamp(*LOG_STD_BOUNDS)) if len(centre) else None
        self.register_buffer("action_centre", torch.tensor(centre, dtype=torch.float32) if np.any(centre) else None,
                             persistent=False)
        self.value_head = _linear(size, 1, 1.0)
        # --normalize_returns: the value head predicts targets in units of their running mean/std.
        self.returns_norm = RunningNorm((), clip=None) if cfg.normalize_returns else None
        # The recurrent state as the trajectory buffers hold it (one definition, appo/memory/buffers.rnn_size): each
        # trunk's core keeps its share (LSTM: h and c). A feed-forward model passes its 1-float placeholder through.
        self.state_size = rnn_size(cfg)
        self.trunk_state_size = self.state_size // len(self.trunks)

    def set_bf16_images(self, enabled: bool) -> None:
        """Run the image encoders under bfloat16 autocast on a CPU (--learner_bf16, --inference_bf16)."""
        for trunk in self.trunks:
            trunk["encoder"].bf16_images = enabled

    def _trunk(self, obs_space: gym.Space, cfg) -> nn.ModuleDict:
        encoder = ObsEncoder(obs_space, cfg)
        trunk = nn.ModuleDict({"encoder": encoder})
        if cfg.use_rnn:
            cell = nn.GRUCell if cfg.rnn_type == "gru" else nn.LSTMCell
            trunk["core"] = cell(encoder.out_size, cfg.hidden_size)
        return trunk

    def _core_step(self, core: nn.Module, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        if self.rnn_type == "gru":
            h = core(x, state)
            return h, h
        h, c = core(x, state.chunk(2, dim=-1))
        return h, torch.cat([h, c], dim=-1)

    def _policy_params(self, raw: Tensor, mask: Tensor | None) -> Tensor:
        """The action params from the policy head's outputs `raw`: logits masked, or Gaussian means and log-stds."""
        if mask is not None:  # masks come with Discrete and MultiDiscrete actions only: params are all logits
            return masked_logits(raw, mask, [n for _, n in self.spec])
        if self.log_std is None:
            return raw
        # Interleave state-independent log-stds after each Gaussian part's means (offset by the box's centre).
        parts, offset, std_offset = [], 0, 0
        for kind, n in self.spec:
            out = raw[..., offset:offset + n]
            if kind == "gaussian":
                centred = out if self.action_centre is None else out + self.action_centre[std_offset:std_offset + n]
                parts += [centred, self.log_std[std_offset:std_offset + n].expand_as(out)]
                std_offset += n
            else:
                parts.append(out)
            offset += n
        return torch.cat(parts, dim=-1)

    def distribution(self, params: Tensor) -> ActionDistribution:
        return ActionDistribution(params, self.spec, self.scalar_action, self.action_centre, self.masked)

    def _values(self, values: Tensor) -> Tensor:
        """Value estimates in reward units (the head's outputs denormalised under --normalize_returns)."""
        return values if self.returns_norm is None else self.returns_norm.denormalize(values)

    def normalize_values(self, values: Tensor) -> Tensor:
        """Values or value targets in the units the value head learns in (unchanged without --normalize_returns)."""
        return values if self.returns_norm is None else self.returns_norm(values)

    @torch.no_grad()
    def update_return_stats(self, targets: Tensor, applied: Tensor | None = None) -> None:
        """Fold targets into the running stats, rescaling the value head so that its denormalised outputs
        stay what they were (PopArt's output preservation): new stats must not shift every value. With `applied`
        (a 0-dim bool tensor: whether the update these targets came from was applied) a False leaves the stats and
        the head as they were, decided on the device."""
        norm = self.returns_norm
        if norm is None:
            return
        changed = (norm.mean, norm.var, norm.count, self.value_head.weight, self.value_head.bias)
        before = [tensor.clone() for tensor in changed] if applied is not None else []
        old_mean, old_std = norm.mean.clone(), norm.std()
        norm.update(targets)
        new_mean, new_std = norm.mean, norm.std()
        self.value_head.weight.mul_(old_std / new_std)
        self.value_head.bias.copy_((old_std * self.value_head.bias + old_mean - new_mean) / new_std)
        for tensor, old in zip(changed, before):
            tensor.copy_(torch.where(applied, tensor, old))

    @torch.no_grad()
    def update_obs_stats(self, obs: ObsDict) -> None:
        if self.obs_norms is not None:
            for key, norm in self.obs_norms.items():
                norm.update(obs[key])

    def _features(self, obs: ObsDict, states: Tensor, dones: Tensor | None) -> tuple[list[Tensor], Tensor]:
        """Per trunk features for obs [n, L, ...] (L steps from start states [n, H]); returns next states."""
        n, length = next(iter(obs.values())).shape[:2]
        flat = {key: x.reshape(n * length, *x.shape[2:]) for key, x in obs.items()}
        outputs, next_states = [], []
        for i, trunk in enumerate(self.trunks):
            x = trunk["encoder"](flat, self.obs_norms)
            if self.use_rnn:
                state = states[:, i * self.trunk_state_size:(i + 1) * self.trunk_state_size]
                x = x.reshape(n, length, -1)
                steps = []
                for t in range(length):
                    out, state = self._core_step(trunk["core"], x[:, t], state)
                    steps.append(out)
                    if dones is not None:
                        state = state * (1.0 - dones[:, t:t + 1])
                x = torch.stack(steps, dim=1).reshape(n * length, -1)
                next_states.append(state)
            outputs.append(x)
        return outputs, torch.cat(next_states, dim=-1) if next_states else states

    def _heads(self, obs: ObsDict, states: Tensor, dones: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """The policy and value heads' outputs [n * L, ...] for obs [n, L, ...], and the next states.

        With --mirror_symmetry each is the mean over the observation and its mirror image, the mirror's logits put
        back in the columns' order: the policy and value are left-right symmetric whatever the weights, so what the
        model learns of a position holds for its mirror image too (a second forward pass of each batch)."""
        if self.mirror_axes is None:
            features, next_states = self._features(obs, states, dones)
            return self.policy_head(features[0]), self.value_head(features[-1]).squeeze(-1), next_states
        both = {key: torch.cat([x, x.flip(2 + self.mirror_axes[key])]) for key, x in obs.items()}
        features, _ = self._features(both, states, None)  # feed-forward only (check_mirror_symmetry): no states
        logits = self.policy_head(features[0]).unflatten(0, (2, -1))  # [original or mirror, n * L, actions]
        values = self.value_head(features[-1]).squeeze(-1).unflatten(0, (2, -1))
        return (logits[0] + logits[1].flip(-1)) / 2, values.mean(0), states

    def forward_step(self, obs: ObsDict, rnn_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One step for a batch of agents: (action params, values, next rnn states)."""
        raw, values, next_states = self._heads({k: v.unsqueeze(1) for k, v in obs.items()}, rnn_states, None)
        mask = obs[MASK_KEY] if self.masked else None
        return self._policy_params(raw, mask), self._values(values), next_states

    def forward_sequence(self, obs: ObsDict, rnn_states: Tensor, dones: Tensor) -> tuple[Tensor, Tensor]:
        """Sequences obs [n, L, ...] from start states [n, H]; dones [n, L] reset the state after a step."""
        n, length = dones.shape
        raw, values, _ = self._heads(obs, rnn_states, dones)
        mask = obs[MASK_KEY].reshape(n * length, -1) if self.masked else None
        params = self._policy_params(raw, mask)
        return params.reshape(n, length, -1), self._values(values).reshape(n, length)
