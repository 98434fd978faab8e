"""Model: recurrent state handling, encoders and heads for every supported space, distributions; that the model
agrees with the trajectory buffers (state size) and with the config (encoder names), and that an encoder learns."""

import copy
import dataclasses
import math
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from appo.config.cfg import build_parser, resolve
from appo.config.encoders import AUTO, BUILT_IN_ENCODERS
from appo.config.hyperparams import Hyperparams
from appo.learning import losses
from appo.learning.model import ENCODERS, ActionDistribution, ActorCritic, ImpalaResnet, NatureCnn
from appo.learning.policy import load_optimizer_state, make_optimizer
from appo.learning.ppo import (
    UPDATE_FIELDS,
    bootstrap_values,
    forward_trajectories,
    minibatch_loss,
    ppo_updates,
    train_step,
)
from appo.memory.buffers import Layout
from appo.spaces import action_layout, action_spec, to_env_action


def make_cfg(**overrides):
    cfg = build_parser().parse_args(["--env=unused", "--hidden_size=16"])
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return resolve(cfg)


OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def as_obs(x):
    return {"obs": x}


@pytest.mark.parametrize("rnn_type,shared", [("gru", True), ("lstm", True), ("gru", False)])
def test_sequence_matches_steps_with_reset_at_episode_end(rnn_type, shared):
    torch.manual_seed(0)
    cfg = make_cfg(use_rnn=True, rnn_type=rnn_type, recurrence=4, actor_critic_share_weights=shared)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), cfg)
    state_size = 16 * (2 if rnn_type == "lstm" else 1) * (1 if shared else 2)
    obs = torch.randn(2, 6, 3)
    dones = torch.zeros(2, 6)
    dones[0, 2] = 1.0  # episode of trajectory 0 ends after step 2
    start = torch.randn(2, state_size)

    params, values = model.forward_sequence(as_obs(obs), start, dones)

    state = start
    for t in range(6):
        step_params, step_values, state = model.forward_step(as_obs(obs[:, t]), state)
        assert state.shape == (2, state_size)
        assert torch.allclose(step_params, params[:, t], atol=1e-6)
        assert torch.allclose(step_values, values[:, t], atol=1e-6)
        state = state * (1 - dones[:, t:t + 1])

    # Without the reset, step 3 onwards of trajectory 0 would differ.
    _, values_no_reset = model.forward_sequence(as_obs(obs), start, torch.zeros(2, 6))
    assert not torch.allclose(values_no_reset[0, 3:], values[0, 3:])
    assert torch.allclose(values_no_reset[1], values[1])


def test_reset_state_equals_fresh_episode():
    """After a done, the next step sees exactly a zero state, as at the start of an episode."""
    torch.manual_seed(1)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), make_cfg(use_rnn=True, recurrence=4))
    obs = torch.randn(1, 4, 3)
    dones = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    _, values = model.forward_sequence(as_obs(obs), torch.randn(1, 16), dones)
    _, fresh = model.forward_sequence(as_obs(obs[:, 2:]), torch.zeros(1, 16), torch.zeros(1, 2))
    assert torch.allclose(values[:, 2:], fresh, atol=1e-6)


def test_learner_chunks_start_from_recorded_states():
    """forward_trajectories cuts T=8 into chunks of recurrence=4 that start from the stored states."""
    torch.manual_seed(2)
    cfg = make_cfg(use_rnn=True, recurrence=4)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), cfg)
    obs = torch.randn(3, 9, 3)
    rnn_states = torch.randn(3, 9, 16)
    dones = torch.zeros(3, 8)
    _, values = forward_trajectories(model, cfg.recurrence, {"obs": as_obs(obs), "rnn_states": rnn_states,
                                                             "dones": dones})
    _, second_chunk = model.forward_sequence(as_obs(obs[:, 4:8]), rnn_states[:, 4], dones[:, 4:8])
    assert torch.allclose(values[:, 4:], second_chunk, atol=1e-6)


@pytest.mark.parametrize("use_rnn,rnn_type,shared", [(False, "gru", True), (False, "lstm", False), (True, "gru", True),
                                                    (True, "lstm", True), (True, "gru", False), (True, "lstm", False)])
def test_the_state_a_model_keeps_is_the_state_the_buffers_hold(use_rnn, rnn_type, shared):
    """The model's state size and the trajectory layout's come from one definition; the state it returns fits."""
    cfg = make_cfg(use_rnn=use_rnn, rnn_type=rnn_type, actor_critic_share_weights=shared)
    layout = Layout.from_cfg(cfg, OBS, gym.spaces.Discrete(2))
    model = ActorCritic(OBS, gym.spaces.Discrete(2), cfg)
    assert model.state_size == layout.rnn_size
    _, _, state = model.forward_step(as_obs(torch.randn(3, 3)), torch.randn(3, layout.rnn_size))
    assert state.shape == (3, layout.rnn_size)


def test_every_built_in_encoder_name_is_the_models():
    """--encoder is checked against the config's names without torch; the model builds exactly those."""
    assert set(ENCODERS) == set(BUILT_IN_ENCODERS)
    space = gym.spaces.Box(0, 255, (3, 36, 36), np.uint8)  # big enough for every image encoder
    for name in (AUTO, *BUILT_IN_ENCODERS):
        model = ActorCritic(space, gym.spaces.Discrete(2), make_cfg(encoder=name))
        assert model.forward_step(random_obs(space, 2), torch.zeros(2, 1))[1].shape == (2,)


def test_impala_resnet_learns_to_tell_two_kinds_of_image_apart():
    """A bright bar on the left or on the right of noisy frames: a linear read-out of the ResNet's features learns
    which, in a few Adam steps, for frames it has not seen; every weight gets a gradient on the way."""
    torch.manual_seed(0)
    space = gym.spaces.Box(0, 255, (3, 24, 24), np.uint8)

    def frames(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, 2, (n,))
        x = torch.rand(n, 3, 24, 24) * 0.5
        for i, label in enumerate(labels.tolist()):
            x[i, :, 4:20, 3 + 14 * label:7 + 14 * label] += 0.5
        return x, labels

    encoder = ImpalaResnet(space, make_cfg())
    head = torch.nn.Linear(encoder.out_size, 2)
    optimizer = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=1e-3)
    for step in range(30):
        x, labels = frames(32)
        loss = torch.nn.functional.cross_entropy(head(encoder(x)), labels)
        optimizer.zero_grad()
        loss.backward()
        if step == 0:
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())
        optimizer.step()
    x, labels = frames(200)
    with torch.no_grad():
        accuracy = (head(encoder(x)).argmax(-1) == labels).float().mean().item()
    assert accuracy > 0.95


IMAGE = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
OBS_SPACES = {
    "vector": OBS,
    "image": IMAGE,
    "image_hwc": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8),
    "dict": gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (3, 48, 48), np.uint8), "state": OBS}),
    "scalar": gym.spaces.Box(-1, 1, (), np.float32),  # a Box of shape (): a batch of it is [B]
}
ACTION_SPACES = {
    "discrete": gym.spaces.Discrete(5),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 2, 4]),
    "multi_binary": gym.spaces.MultiBinary(3),
    "box": gym.spaces.Box(-2, 2, (2,), np.float32),
    "tuple": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32))),
}


def random_obs(space, batch):
    if isinstance(space, gym.spaces.Dict):
        return {key: random_obs(sub, batch)["obs"] for key, sub in space.spaces.items()}
    return {"obs": torch.as_tensor(np.stack([space.sample() for _ in range(batch)]))}


@pytest.mark.parametrize("obs_name", list(OBS_SPACES))
@pytest.mark.parametrize("action_name", list(ACTION_SPACES))
def test_shapes_for_every_space_combination(obs_name, action_name):
    obs_space, action_space = OBS_SPACES[obs_name], ACTION_SPACES[action_name]
    model = ActorCritic(obs_space, action_space, make_cfg(normalize_input=True))
    params, values, _ = model.forward_step(random_obs(obs_space, 5), torch.zeros(5, 1))
    assert values.shape == (5,)
    dist = model.distribution(params)
    actions = dist.sample()
    shape, dtype = action_layout(action_space)
    assert tuple(actions.shape) == (5, *shape)
    assert dist.log_prob(actions).shape == (5,) and dist.entropy().shape == (5,)
    stored = actions.detach().numpy().astype(dtype)
    assert action_space.contains(to_env_action(action_space, stored[0]))


@pytest.mark.parametrize("initial_stddev", [1.0, 0.3])
def test_continuous_actions_start_with_the_initial_stddev_around_the_mean(initial_stddev):
    torch.manual_seed(0)
    action_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    model = ActorCritic(OBS, action_space, make_cfg(initial_stddev=initial_stddev))
    params, _, _ = model.forward_step(as_obs(torch.zeros(20000, 3)), torch.zeros(20000, 1))
    dist = model.distribution(params)
    actions = dist.sample()
    mean = dist.mode()
    assert torch.allclose((actions - mean).std(0), torch.full((6,), initial_stddev), rtol=0.03)
    expected_entropy = 6 * (math.log(initial_stddev) + 0.5 * math.log(2 * math.pi * math.e))
    assert dist.entropy()[0].item() == pytest.approx(expected_entropy, rel=1e-5)


UNIT_BOX_CLIPPED = 0.3173  # P(|z| > 1): the share of std 1's samples that a box of [-1, 1] clips to a bound


@pytest.mark.parametrize("low,high,centre,std", [
    ([0.9], [1.0], [0.95], [0.05]),  # off centre: the old mean of 0 clipped nearly every sample to 0.9
    ([0.0], [1.0], [0.5], [0.5]),  # asymmetric: half the samples clipped at 0
    ([-1.0], [3.0], [1.0], [1.0]),  # wider than std 1: the scalar std
    ([-0.1, -1.0, -2.0], [0.1, 1.0, 2.0], [0.0, 0.0, 0.0], [0.1, 1.0, 1.0]),  # one narrow dimension narrows only itself
    ([-1.0, 0.5], [1.0, 0.5], [0.0, 0.5], [1.0, 1.0]),  # zero width: ignored by the rule, its samples clip to 0.5
    ([-np.inf, 0.0, -np.inf], [np.inf, np.inf, 2.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]),  # an infinite bound: centre 0
])
def test_the_gaussian_starts_at_the_box_centre_with_a_std_per_dimension(low, high, centre, std):
    """An untrained policy's mean action is the box's centre (0 where a bound is infinite), each dimension's std is at
    most its half width, and no finite dimension of non-zero width clips more of its samples at the bounds than std 1
    does on [-1, 1]; log-probs stay finite, zero-width dimensions included."""
    torch.manual_seed(0)
    space = gym.spaces.Box(np.array(low, np.float32), np.array(high, np.float32))
    model = ActorCritic(OBS, space, make_cfg())
    params, _, _ = model.forward_step(as_obs(torch.zeros(40000, 3)), torch.zeros(40000, 1))
    dist = model.distribution(params)
    actions = dist.sample().detach()
    assert np.allclose(actions.mean(0).numpy(), centre, atol=0.02 + 0.02 * np.array(std))
    assert np.allclose(model.log_std.exp().detach().numpy(), std, rtol=1e-6)
    assert torch.isfinite(dist.log_prob(actions)).all() and torch.isfinite(dist.entropy()).all()
    env_actions = np.stack([to_env_action(space, a) for a in actions[:4000].numpy()])
    clipped = ((env_actions <= space.low) | (env_actions >= space.high)).mean(0)
    varies = np.isfinite(space.low) & np.isfinite(space.high) & (space.high > space.low)
    assert (clipped[varies] <= UNIT_BOX_CLIPPED + 0.03).all()


def test_a_given_initial_stddev_is_the_scalar_the_box_caps():
    """--initial_stddev sets every dimension's std but where the box is narrower: [-0.4, 0.4] keeps 0.4."""
    space = gym.spaces.Box(np.array([-0.4, -2.0], np.float32), np.array([0.4, 2.0], np.float32))
    model = ActorCritic(OBS, space, make_cfg(initial_stddev=0.6))
    assert np.allclose(model.log_std.exp().detach().numpy(), [0.4, 0.6])
    assert "action_centre" not in model.state_dict()  # from the action space, so older checkpoints load


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_resnet"])
def test_image_encoders(encoder):
    model = ActorCritic(IMAGE, gym.spaces.Discrete(4), make_cfg(encoder=encoder))
    obs = random_obs(IMAGE, 3)
    assert obs["obs"].dtype == torch.uint8
    params, values, _ = model.forward_step(obs, torch.zeros(3, 1))
    assert params.shape == (3, 4) and values.shape == (3,)


@pytest.mark.parametrize("shape,last", [
    ((4, 84, 84), False), ((84, 84, 4), True), ((210, 160, 3), True), ((3, 72, 128), False), ((6, 7, 2), True),
    ((2, 6, 7), False), ((10, 10, 7), True), ((10, 10, 10), True), ((8, 8, 111), True), ((19, 19, 17), True),
    ((17, 19, 19), False), ((12, 84, 84), False), ((72, 128, 12), True), ((12, 72, 128), False)])
def test_the_channels_are_read_from_the_shape(shape, last):
    """Stacked frames, RGB, board planes (connect four's 2, MinAtar's up to 10, chess's 111, go's 17) at either end."""
    from appo.spaces import channels_last

    assert channels_last(shape) == last


@pytest.mark.parametrize("shape,expected", [((10, 10, 4), "small_cnn"), ((4, 10, 10), "small_cnn"),
                                            ((3, 5, 5), "small_cnn"), ((1, 1, 1), "small_cnn"),
                                            ((4, 84, 84), "nature_cnn"), ((36, 36, 3), "nature_cnn"),
                                            ((7,), "mlp"), ((84, 84), "mlp"), ((10, 5), "mlp")])
def test_auto_encoder_fits_the_image_size(shape, expected):
    """Three axes are images; two, uint8 ones too (a grey frame with no channel axis), are a vector."""
    from appo.spaces import auto_encoder

    space = gym.spaces.Box(0, 255, shape, np.uint8)
    assert auto_encoder(space)[0] == expected
    model = ActorCritic(space, gym.spaces.Discrete(4), make_cfg(encoder="auto"))
    obs = random_obs(space, 3)
    params, values, _ = model.forward_step(obs, torch.zeros(3, 1))
    assert params.shape == (3, 4) and values.shape == (3,)
    (params.sum() + values.sum()).backward()  # trainable end to end
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad and p is not model.log_std)


@pytest.mark.parametrize("shape,features", [
    ((10, 10, 4), 5 * 5 * 64), ((6, 7, 2), 3 * 4 * 64), ((19, 19, 17), 10 * 10 * 64),
    ((20, 20, 3), 5 * 5 * 64), ((32, 32, 3), 8 * 8 * 64), ((3, 35, 35), 9 * 9 * 64), ((40, 20), 10 * 5 * 64)])
def test_the_small_cnn_strides_twice_from_20_pixels_a_side(shape, features):
    """Grids under SMALL_CNN_SECOND_STRIDE (MinAtar's 10x10, connect four's 6x7, go's 19x19) keep one stride; larger
    images get a second, so the fully connected layer sees at most 10x10 places."""
    from appo.learning.model import SmallCnn

    space = gym.spaces.Box(0, 255, shape, np.uint8)
    encoder = SmallCnn(space, make_cfg())
    assert encoder.fc[1].in_features == features
    assert encoder(random_obs(space, 2)["obs"].float()).shape == (2, 512)


@pytest.mark.parametrize("encoder,shape", [("nature_cnn", (84, 84)), ("small_cnn", (10, 5)),
                                           ("impala_resnet", (64, 64))])
def test_a_cnn_named_by_the_flag_takes_a_grey_frame_without_a_channel_axis(encoder, shape):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    model = ActorCritic(space, gym.spaces.Discrete(4), make_cfg(encoder=encoder))
    params, values, _ = model.forward_step(random_obs(space, 3), torch.zeros(3, 1))
    assert params.shape == (3, 4) and values.shape == (3,)


@pytest.mark.parametrize("encoder", ["small_cnn", "impala_resnet"])
def test_a_cnn_named_by_the_flag_encodes_a_dicts_images_and_leaves_its_vectors_to_the_mlp(encoder):
    """Connect four's board and action mask: the named CNN takes the board, the MLP the mask, as auto gives them."""
    from appo.learning.model import MlpEncoder

    space = gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (6, 7, 2), np.int8),
                             "action_mask": gym.spaces.Box(0, 1, (7,), np.int8)})
    model = ActorCritic(space, gym.spaces.Discrete(7), make_cfg(encoder=encoder))
    encoders = model.trunks[0]["encoder"].encoders
    assert type(encoders["observation"]).__name__ == {"small_cnn": "SmallCnn", "impala_resnet": "ImpalaResnet"}[encoder]
    assert isinstance(encoders["action_mask"], MlpEncoder)
    params, values, _ = model.forward_step(random_obs(space, 3), torch.zeros(3, 1))
    assert params.shape == (3, 7) and values.shape == (3,)


@pytest.mark.parametrize("encoder,spaces,error", [
    ("small_cnn", {"board": (6, 7, 2), "mask": (7,)}, None),
    ("small_cnn", {"frame": (10, 5), "position": (3,)}, None),
    ("nature_cnn", {"frame": (84, 84, 3), "speed": (1,)}, None),
    ("small_cnn", {"position": (3,), "mask": (7,)},
     "the observation 'mask' of shape (7,) and the observation 'position' of shape (3,) are no image"),
    ("nature_cnn", {"board": (6, 7, 2), "mask": (7,)}, "'board' of shape (6, 7, 2) is under 36 pixels a side"),
    ("small_cnn", {"clip": (4, 10, 10, 3)}, "'clip' of shape (4, 10, 10, 3) has more axes than an image's three"),
    ("mlp", {"position": (3,)}, None),
])
def test_a_named_cnn_is_refused_only_where_it_has_no_image_to_take(encoder, spaces, error):
    from appo.spaces import SpaceError, check_encoder_fits

    space = gym.spaces.Dict({key: gym.spaces.Box(0, 255, shape, np.uint8) for key, shape in spaces.items()})
    if error is None:
        check_encoder_fits(encoder, space)
        return
    with pytest.raises(SpaceError, match=re.escape(f"--encoder={encoder}: ") + ".*" + re.escape(error)):
        check_encoder_fits(encoder, space)


def test_distributions_match_torch():
    logits = torch.randn(4, 3)
    dist = ActionDistribution(logits, [("discrete", 3)], scalar_action=True)
    reference = torch.distributions.Categorical(logits=logits)
    actions = torch.tensor([0, 2, 1, 2])
    assert torch.allclose(dist.log_prob(actions), reference.log_prob(actions))
    assert torch.allclose(dist.entropy(), reference.entropy())

    mean, log_std = torch.randn(4, 2), torch.randn(4, 2) * 0.3
    dist = ActionDistribution(torch.cat([mean, log_std], -1), [("gaussian", 2)], scalar_action=False)
    reference = torch.distributions.Normal(mean, log_std.exp())
    actions = torch.randn(4, 2)
    assert torch.allclose(dist.log_prob(actions), reference.log_prob(actions).sum(-1), atol=1e-5)
    assert torch.allclose(dist.entropy(), reference.entropy().sum(-1), atol=1e-5)


def test_composite_distribution_is_a_product():
    space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)))
    spec = action_spec(space)
    logits, mean, log_std = torch.randn(4, 3), torch.randn(4, 2), torch.randn(4, 2) * 0.2
    dist = ActionDistribution(torch.cat([logits, mean, log_std], -1), spec, scalar_action=False)
    actions = torch.cat([torch.tensor([[0.0], [2.0], [1.0], [1.0]]), torch.randn(4, 2)], -1)
    expected = (torch.distributions.Categorical(logits=logits).log_prob(actions[:, 0].long())
                + torch.distributions.Normal(mean, log_std.exp()).log_prob(actions[:, 1:]).sum(-1))
    assert torch.allclose(dist.log_prob(actions), expected, atol=1e-5)


def test_symmetric_kl_is_zero_at_prior_and_positive_elsewhere():
    uniform = ActionDistribution(torch.zeros(1, 4), [("discrete", 4)], True)
    assert uniform.symmetric_kl_to_prior().item() == pytest.approx(0.0, abs=1e-6)
    peaked = ActionDistribution(torch.tensor([[5.0, 0.0]]), [("discrete", 2)], True)
    p = torch.softmax(torch.tensor([5.0, 0.0]), 0)
    expected = (p * (p / 0.5).log()).sum() + (0.5 * (0.5 / p).log()).sum()
    assert peaked.symmetric_kl_to_prior().item() == pytest.approx(expected.item(), rel=1e-5)
    standard = ActionDistribution(torch.zeros(1, 4), [("gaussian", 2)], False)
    assert standard.symmetric_kl_to_prior().item() == pytest.approx(0.0, abs=1e-6)
    shifted = ActionDistribution(torch.tensor([[1.0, 0.0, math.log(2.0), 0.0]]), [("gaussian", 2)], False)
    # dim 0: KL(N(1,4)||N(0,1)) + KL(N(0,1)||N(1,4)) = (0.5*(4+1-1) - ln2) + (0.5*((1+1)/4 - 1) + ln2); dim 1: 0
    assert shifted.symmetric_kl_to_prior().item() == pytest.approx(2.0 - 0.25, rel=1e-5)


def test_obs_statistics_stay_finite_for_huge_observations_and_unchanged_by_no_rows():
    """Observations of 1e30 square past float32: the variance was inf, every later weight NaN, and the run ended
    'completed' without a checkpoint. No rows at all (a minibatch without a known return) change nothing."""
    model = ActorCritic(OBS, gym.spaces.Discrete(2), make_cfg(normalize_input=True))
    norm = model.obs_norms["obs"]
    for _ in range(3):
        model.update_obs_stats({"obs": torch.randn(64, 3) * 1e30})
    assert torch.isfinite(norm.mean).all() and torch.isfinite(norm.var).all()
    assert torch.isfinite(model.forward_step({"obs": torch.randn(5, 3) * 1e30}, torch.zeros(5, 1))[1]).all()
    before = [norm.mean.clone(), norm.var.clone(), norm.count.clone()]
    norm.update(torch.zeros(0, 3))
    assert all(torch.equal(a, b) for a, b in zip(before, (norm.mean, norm.var, norm.count)))


def test_obs_normalisation_travels_with_the_weights():
    """Inference normalises exactly as the learner does: the running stats are published with the weights."""
    cfg = make_cfg(normalize_input=True)
    learner_model = ActorCritic(OBS, gym.spaces.Discrete(2), cfg)
    learner_model.update_obs_stats({"obs": torch.randn(500, 3) * 4 + 10})
    assert learner_model.obs_norms["obs"].mean.mean().item() == pytest.approx(10, abs=1)
    inference_model = ActorCritic(OBS, gym.spaces.Discrete(2), cfg)
    # What WeightsPublisher/Subscriber copy: every floating state tensor, parameters and buffers alike.
    source = [t for t in learner_model.state_dict().values() if t.is_floating_point()]
    target = [t for t in inference_model.state_dict(keep_vars=True).values() if t.is_floating_point()]
    with torch.no_grad():
        for s, t in zip(source, target):
            t.copy_(s)
    obs = {"obs": torch.randn(7, 3) * 4 + 10}
    assert torch.equal(learner_model.forward_step(obs, torch.zeros(7, 1))[1],
                       inference_model.forward_step(obs, torch.zeros(7, 1))[1])


def test_return_normalisation_preserves_values_when_its_stats_move():
    """PopArt's output preservation: new return statistics rescale the value head instead of shifting values."""
    model = ActorCritic(OBS, gym.spaces.Discrete(2), make_cfg(normalize_returns=True))
    obs = as_obs(torch.randn(6, 3))
    before = model.forward_step(obs, torch.zeros(6, 1))[1]
    targets = torch.randn(1000) * 30 + 100
    model.update_return_stats(targets)
    assert model.returns_norm.mean.item() == pytest.approx(100, abs=3)
    assert model.returns_norm.std().item() == pytest.approx(30, rel=0.1)
    after = model.forward_step(obs, torch.zeros(6, 1))[1]
    assert torch.allclose(before, after, atol=1e-4)
    # The value loss sees targets in the head's units: mean 0, std 1.
    normalized = model.normalize_values(targets)
    assert normalized.mean().item() == pytest.approx(0, abs=0.05)
    assert normalized.std().item() == pytest.approx(1, rel=0.05)


def test_without_return_normalisation_values_are_the_head_output():
    model = ActorCritic(OBS, gym.spaces.Discrete(2), make_cfg(normalize_returns=False))
    targets = torch.randn(10) * 30 + 100
    model.update_return_stats(targets)
    assert model.returns_norm is None and torch.equal(model.normalize_values(targets), targets)


def test_nature_cnn_keeps_the_signal_of_a_few_pixels():
    """Frames that differ only where a ball is (a 2x2 patch) must give features that differ about as
    much as the frames do: with PyTorch's default conv init three layers shrank both ~15x and Breakout
    never learned."""
    torch.manual_seed(0)
    frames = torch.zeros(8, 4, 84, 84)
    frames[:, :, 40:60, :] = 0.5  # a band of bricks
    for i in range(8):
        frames[i, :, 70:72, 8 * i:8 * i + 2] = 1.0  # the ball in 8 places
    encoder = NatureCnn(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), make_cfg())
    with torch.no_grad():
        features = encoder(frames)
    assert features.pow(2).mean().sqrt() > 0.5 * frames.pow(2).mean().sqrt()
    assert features.std(0).mean() > 2 * frames.std(0).mean()


def test_bf16_image_encoder_keeps_heads_float32_and_outputs_close():
    """--learner_bf16: only the CNN runs in bfloat16 (on a CPU); what comes out is float32 and near the float32
    model's, and gradients reach every weight."""
    torch.manual_seed(0)
    model = ActorCritic(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4), make_cfg())
    obs = {"obs": torch.randint(0, 256, (8, 1, 4, 84, 84), dtype=torch.uint8)}
    states, dones = torch.zeros(8, 0), torch.zeros(8, 1)
    params32, values32 = model.forward_sequence(obs, states, dones)
    model.set_bf16_images(True)
    params16, values16 = model.forward_sequence(obs, states, dones)
    assert params16.dtype == values16.dtype == torch.float32
    assert not torch.equal(params16, params32)  # bfloat16 did run
    assert torch.allclose(params16, params32, atol=0.02) and torch.allclose(values16, values32, atol=0.05)
    (params16.sum() + values16.sum()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad
               and p is not model.log_std)


@pytest.mark.parametrize("rows", [8, 4096])
def test_the_mlp_tanh_equals_torch_tanh_with_and_without_autograd(rows):
    """Large no-grad batches take the sigmoid form (appo.learning.model.Tanh); outputs agree with torch.tanh, and
    with autograd the gradient is torch.tanh's."""
    from appo.learning.model import FAST_TANH_MIN_ELEMENTS, Tanh

    x = torch.randn(rows, 64) * 4
    with torch.inference_mode():
        fast = Tanh()(x)
    assert (rows * 64 >= FAST_TANH_MIN_ELEMENTS) == (rows == 4096)
    assert torch.allclose(fast, torch.tanh(x), rtol=0, atol=3e-7)
    assert fast.abs().max() <= 1.0
    grad_input = x.clone().requires_grad_(True)
    Tanh()(grad_input).sum().backward()
    assert torch.allclose(grad_input.grad, 1 - torch.tanh(x) ** 2, atol=1e-6)


def test_kl_loss_coeff_adds_the_kl_penalty_to_the_loss():
    torch.manual_seed(3)
    cfg = make_cfg(actor_critic_share_weights=False)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    n, t = 4, 8
    mb = {"obs": as_obs(torch.randn(n, t + 1, 3)), "rnn_states": torch.zeros(n, t + 1, model.state_size),
          "dones": torch.zeros(n, t), "actions": torch.randn(n, t, 2), "log_probs": torch.randn(n, t) - 2.0,
          "values": torch.zeros(n, t)}
    advantages, targets = torch.randn(n, t), torch.randn(n, t)
    loss, _, stats = minibatch_loss(model, cfg, Hyperparams.from_cfg(cfg), mb, advantages, targets)
    penalised, _, _ = minibatch_loss(model, dataclasses.replace(cfg, kl_loss_coeff=0.5), Hyperparams.from_cfg(cfg), mb,
                                     advantages, targets)
    assert stats["kl"].item() > 0.1  # the behaviour log-probs are far from the model's
    assert (penalised - loss).item() == pytest.approx(0.5 * stats["kl"].item(), rel=1e-5)


def stale_minibatch(model: ActorCritic, n: int = 4, t: int = 8) -> dict:
    """Trajectories whose actions a policy some updates older than `model` took: its log-probs are the model's plus
    noise."""
    mb = {"obs": as_obs(torch.randn(n, t + 1, 3)), "rnn_states": torch.zeros(n, t + 1, model.state_size),
          "dones": torch.zeros(n, t), "actions": torch.randn(n, t, 2), "values": torch.zeros(n, t)}
    with torch.no_grad():
        params, _ = forward_trajectories(model, t, mb)
        current = model.distribution(params).log_prob(mb["actions"])
    mb["log_probs"] = current + 0.5 * torch.randn(n, t)
    return mb


def test_the_iterations_proximal_policy_moves_the_clip_and_weights_the_advantages():
    """--proximal_policy=iteration: the ratio is taken to the log-probs of the iteration's start (here the current
    weights: no sample clipped, no KL), and each advantage is weighted by proximal / behaviour; with the proximal
    log-probs equal to the behaviour's the loss is the classic one."""
    from appo.learning.ppo import start_log_probs

    torch.manual_seed(5)
    cfg = make_cfg(actor_critic_share_weights=False)
    decoupled_cfg = dataclasses.replace(cfg, proximal_policy="iteration")
    hp = Hyperparams.from_cfg(cfg)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    mb = stale_minibatch(model)
    advantages, targets = torch.randn(4, 8), torch.randn(4, 8)
    _, _, classic = minibatch_loss(model, cfg, hp, mb, advantages, targets)
    assert classic["clip_fraction"].item() > 0.3

    start = start_log_probs(model, cfg.recurrence, mb)
    _, _, decoupled = minibatch_loss(model, decoupled_cfg, hp, mb | {"start_log_probs": start}, advantages, targets)
    weights = torch.exp(start - mb["log_probs"])
    assert decoupled["clip_fraction"].item() == 0.0 and decoupled["kl"].item() == pytest.approx(0.0, abs=1e-6)
    assert decoupled["policy_loss"].item() == pytest.approx(-(weights * advantages).mean().item(), rel=1e-5)

    same, _, _ = minibatch_loss(model, decoupled_cfg, hp, mb | {"start_log_probs": mb["log_probs"]}, advantages,
                                targets)
    loss, _, _ = minibatch_loss(model, cfg, hp, mb, advantages, targets)
    assert same.item() == pytest.approx(loss.item(), rel=1e-6)


@pytest.mark.parametrize("proximal_policy", ["behaviour", "iteration"])
def test_an_iterations_first_minibatch_clips_stale_samples_only_when_measured_from_the_behaviour_policy(
        proximal_policy):
    torch.manual_seed(6)
    cfg = make_cfg(actor_critic_share_weights=False, proximal_policy=proximal_policy, num_batches_per_iteration=1,
                   ppo_epochs=1, normalize_input=False)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    batch = stale_minibatch(model) | {"rewards": torch.randn(4, 8)}
    ((_, update),) = list(ppo_updates(model, make_optimizer(model, 1e-3, cfg), cfg, Hyperparams.from_cfg(cfg), batch))
    stats = dict(zip(UPDATE_FIELDS, update.tolist()))
    assert (stats["clip_fraction"] > 0.3) == (proximal_policy == "behaviour")


@pytest.mark.parametrize("lr_schedule, measured", [("kl_adaptive", True), ("constant", False)])
def test_the_iteration_kl_leaves_out_the_policy_lag_and_is_taken_only_when_needed(lr_schedule, measured):
    """Stale samples (an asynchronous run's policy lag) put a KL from the behaviour policy into an iteration's first
    minibatch, but none from the weights the iteration started with: that one (--lr_schedule=kl_adaptive's) grows
    with the updates alone. Runs that do not need it skip its forward pass and report NaN."""
    torch.manual_seed(7)
    cfg = make_cfg(actor_critic_share_weights=False, lr_schedule=lr_schedule, num_batches_per_iteration=1,
                   ppo_epochs=3, normalize_input=False)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    batch = stale_minibatch(model) | {"rewards": torch.randn(4, 8)}
    updates = ppo_updates(model, make_optimizer(model, 1e-2, cfg), cfg, Hyperparams.from_cfg(cfg), batch)
    rows = [dict(zip(UPDATE_FIELDS, update.tolist())) for _, update in updates]
    assert all(row["kl"] > 0.05 for row in rows)
    if measured:
        assert rows[0]["iteration_kl"] == pytest.approx(0.0, abs=1e-7)
        assert 0.0 < rows[1]["iteration_kl"] < rows[2]["iteration_kl"] < rows[2]["kl"]
    else:
        assert all(math.isnan(row["iteration_kl"]) for row in rows)


def test_kl_adaptive_takes_no_start_log_probs_where_an_iteration_is_one_update():
    """One pass of one minibatch (images' defaults) measures its KL before its only step: 0, which leaves the rate
    where it is. kl_adaptive then skips the forward pass that KL would cost (NaN: not measured) and trains the weights
    a constant rate does."""
    torch.manual_seed(8)
    cfg = make_cfg(actor_critic_share_weights=False, lr_schedule="kl_adaptive", num_batches_per_iteration=1,
                   ppo_epochs=1, normalize_input=False)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    batch = stale_minibatch(model) | {"rewards": torch.randn(4, 8)}
    ((_, update),) = list(ppo_updates(copy.deepcopy(model), make_optimizer(model, 1e-2, cfg), cfg,
                                      Hyperparams.from_cfg(cfg), dict(batch)))
    assert math.isnan(dict(zip(UPDATE_FIELDS, update.tolist()))["iteration_kl"])
    hp = Hyperparams.from_cfg(cfg)
    constant = iterated(model, dataclasses.replace(cfg, lr_schedule="constant"), hp, batch)
    assert all(torch.equal(a, b) for a, b in zip(iterated(model, cfg, hp, batch), constant))


def iterated(model: ActorCritic, cfg, hp: Hyperparams, batch: dict) -> list[torch.Tensor]:
    """The weights of a copy of `model` after one `ppo_updates` iteration over `batch` (minibatches drawn by seed 0,
    the Adam of learning rate 1e-2)."""
    learner = copy.deepcopy(model)
    list(ppo_updates(learner, make_optimizer(learner, 1e-2, cfg), cfg, hp, dict(batch),
                     torch.Generator().manual_seed(0)))
    return [p.detach() for p in learner.parameters()]


@pytest.mark.parametrize("recompute", [True, False])
def test_each_pass_takes_gae_from_the_current_values_only_with_recompute_advantages(recompute):
    """A reference that steps pass by pass, GAE by hand from the values of the model as it is at each pass's start
    (--recompute_advantages) or from the stored behaviour values and the first bootstrap (the default), trains the
    same weights as `ppo_updates`; the two settings train different ones."""
    torch.manual_seed(9)
    cfg = make_cfg(actor_critic_share_weights=False, recompute_advantages=recompute, num_batches_per_iteration=2,
                   ppo_epochs=3, normalize_input=False, minibatch_unit="trajectory")
    hp = Hyperparams.from_cfg(cfg)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    batch = stale_minibatch(model) | {"rewards": torch.randn(4, 8), "values": torch.randn(4, 8)}

    reference = copy.deepcopy(model)
    optimizer, shuffle = make_optimizer(reference, 1e-2, cfg), torch.Generator().manual_seed(0)
    bootstrap = bootstrap_values(reference, batch)
    for _ in range(cfg.ppo_epochs):
        values = batch["values"]
        if recompute:
            with torch.no_grad():
                values = forward_trajectories(reference, cfg.recurrence, batch)[1]
            bootstrap = bootstrap_values(reference, batch)
        advantages, targets = losses.gae(batch["rewards"], batch["dones"], values, bootstrap, hp.gamma,
                                         hp.gae_lambda)
        for rows in torch.randperm(4, generator=shuffle).chunk(2):
            train_step(reference, optimizer, cfg, hp, {name: tensor[rows] for name, tensor in batch.items()
                                                       if name != "obs"} | {"obs": as_obs(batch["obs"]["obs"][rows])},
                       advantages[rows], targets[rows])
    ours = iterated(model, cfg, hp, batch)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference.parameters()))
    other = iterated(model, dataclasses.replace(cfg, recompute_advantages=not recompute), hp, batch)
    assert not all(torch.equal(a, b) for a, b in zip(ours, other))


def test_shuffled_steps_train_as_minibatches_of_this_policys_single_steps():
    """--minibatch_unit=step: after GAE over the trajectories, each pass draws its minibatches from the steps this
    policy took (another acting id's steps, `mask` 0, left out), one by one; a reference that flattens them by hand
    and steps through the same draws trains the same weights, and whole-trajectory minibatches train other ones."""
    torch.manual_seed(10)
    cfg = make_cfg(actor_critic_share_weights=False, minibatch_unit="step", num_batches_per_iteration=3, ppo_epochs=2,
                   normalize_input=False)
    hp = Hyperparams.from_cfg(cfg)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    mask = (torch.rand(4, 8) > 0.25).float()
    batch = stale_minibatch(model) | {"rewards": torch.randn(4, 8), "values": torch.randn(4, 8), "mask": mask}

    reference = copy.deepcopy(model)
    optimizer, shuffle = make_optimizer(reference, 1e-2, cfg), torch.Generator().manual_seed(0)
    advantages, targets = losses.gae(batch["rewards"], batch["dones"], batch["values"],
                                     bootstrap_values(reference, batch), hp.gamma, hp.gae_lambda)
    own = mask > 0
    steps = {name: batch[name][own].unsqueeze(1) for name in ("actions", "log_probs", "values", "rewards", "dones")}
    observations = batch["obs"]["obs"][:, :-1][own]
    steps["obs"] = as_obs(torch.stack([observations, observations], dim=1))
    steps["rnn_states"] = torch.zeros(len(observations), 2, model.state_size)
    count = int(own.sum())
    for _ in range(cfg.ppo_epochs):
        for rows in torch.randperm(count, generator=shuffle).chunk(3):
            mb = {name: tensor[rows] for name, tensor in steps.items() if name != "obs"}
            train_step(reference, optimizer, cfg, hp, mb | {"obs": as_obs(steps["obs"]["obs"][rows])},
                       advantages[own][rows].unsqueeze(1), targets[own][rows].unsqueeze(1))
    ours = iterated(model, cfg, hp, batch)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference.parameters()))
    whole = iterated(model, dataclasses.replace(cfg, minibatch_unit="trajectory"), hp, batch)
    assert not all(torch.equal(a, b) for a, b in zip(ours, whole))


def test_one_minibatch_of_one_pass_trains_alike_from_steps_or_whole_trajectories():
    """Images' defaults make an iteration one pass of one minibatch: every step of the batch, whether drawn as single
    steps (--minibatch_unit=auto's choice for a feed-forward model) or as whole trajectories, so both train the same
    weights, up to the order of a sum."""
    torch.manual_seed(11)
    cfg = make_cfg(actor_critic_share_weights=False, minibatch_unit="step", num_batches_per_iteration=1, ppo_epochs=1,
                   normalize_input=False)
    hp = Hyperparams.from_cfg(cfg)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    batch = stale_minibatch(model) | {"rewards": torch.randn(4, 8), "values": torch.randn(4, 8)}
    steps = iterated(model, cfg, hp, batch)
    whole = iterated(model, dataclasses.replace(cfg, minibatch_unit="trajectory"), hp, batch)
    assert not all(torch.equal(a, b) for a, b in zip(steps, model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(steps, whole))


def _snapshot(model: ActorCritic, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor an update may change: weights, normalisation statistics, Adam's moments and step counts."""
    state = [tensor.clone() for tensor in model.state_dict().values()]
    return state + [tensor.clone() for saved in optimizer.state.values() for tensor in saved.values()]


def test_a_non_finite_minibatch_is_skipped_on_the_device_and_the_next_one_applies():
    """The skip needs no host sync (`apply_gradients`): the fused Adam's found_inf leaves weights and moments as they
    were, the return statistics and the value head are restored with torch.where, and the update says applied 0."""
    torch.manual_seed(7)
    cfg = make_cfg(actor_critic_share_weights=False, normalize_returns=True)
    hp = Hyperparams.from_cfg(cfg)
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)
    optimizer = make_optimizer(model, 1e-3, cfg)
    mb = stale_minibatch(model)
    advantages, targets = torch.randn(4, 8), torch.randn(4, 8) * 10 + 50
    first = dict(zip(UPDATE_FIELDS, train_step(model, optimizer, cfg, hp, mb, advantages, targets).tolist()))
    assert first["applied"] == 1.0 and math.isfinite(first["loss"])
    before = _snapshot(model, optimizer)
    nan_targets = targets.clone()
    nan_targets[0, 0] = float("nan")
    skipped = train_step(model, optimizer, cfg, hp, mb, advantages, nan_targets)
    assert skipped[UPDATE_FIELDS.index("applied")].item() == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(model, optimizer)))
    again = train_step(model, optimizer, cfg, hp, mb, advantages, targets)
    assert again[UPDATE_FIELDS.index("applied")].item() == 1.0
    assert not all(torch.equal(a, b) for a, b in zip(before, _snapshot(model, optimizer)))
    assert all(saved["step"].item() == 2.0 for saved in optimizer.state.values())


def test_an_optimizer_state_saved_unfused_loads_into_the_fused_adam_and_steps_alike():
    """Checkpoints written before the learner's Adam was fused say fused: None and keep CPU step counts; loaded
    through `load_optimizer_state` they continue as the fused Adam, with the same moments as the plain one's next
    step (to rounding)."""
    torch.manual_seed(8)
    cfg = make_cfg()
    model = ActorCritic(OBS, gym.spaces.Discrete(3), cfg)
    plain = torch.optim.Adam(model.parameters(), lr=1e-3, eps=cfg.adam_eps)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        plain.step()
    saved = copy.deepcopy(plain.state_dict())
    fused = make_optimizer(model, 1e-3, cfg)
    load_optimizer_state(fused, saved)
    assert all(group["fused"] for group in fused.param_groups)
    for p in model.parameters():  # one gradient for both steps
        p.grad = torch.randn_like(p)
    weights = [p.detach().clone() for p in model.parameters()]
    fused.step()
    fused_weights = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(w)
    plain.step()
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(fused_weights, model.parameters()))
    assert all(fused.state[p]["step"].item() == 4.0 for p in model.parameters())
