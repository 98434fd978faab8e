"""--mirror_symmetry: which axis of each observation key the mirror reverses, the spaces it refuses, and a model whose
policy and value are the mean over a position and its mirror image (checked against the same weights run by hand)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from appo.config.cfg import ConfigError, make_config
from appo.learning.model import ActorCritic
from appo.spaces import MASK_KEY, SpaceError, mirror_axes

BOARD = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)  # connect four: rows, columns, each side's pieces
MASK = gym.spaces.Box(0, 1, (7,), np.int8)
CONNECT_FOUR = gym.spaces.Dict({"observation": BOARD, MASK_KEY: MASK})


def test_the_mirror_reverses_an_images_width_and_the_mask():
    assert mirror_axes(CONNECT_FOUR, gym.spaces.Discrete(7)) == {"observation": 1, MASK_KEY: 0}
    channels_first = gym.spaces.Box(0, 255, (3, 10, 7), np.uint8)
    assert mirror_axes(channels_first, gym.spaces.Discrete(7)) == {"obs": 2}


@pytest.mark.parametrize("obs_space, action_space, message", [
    (CONNECT_FOUR, gym.spaces.Box(-1, 1, (7,)), "not the action space Box"),
    (CONNECT_FOUR, gym.spaces.MultiDiscrete([7, 7]), "not the action space MultiDiscrete"),
    (gym.spaces.Dict({"observation": BOARD, MASK_KEY: gym.spaces.Box(0, 1, (6,), np.int8)}), gym.spaces.Discrete(6),
     "'observation' is 6x7x2, 7 wide, for 6 actions"),
    (CONNECT_FOUR, gym.spaces.Discrete(6), "the observation 'action_mask' of shape (7,) is no image"),
    (gym.spaces.Box(-1, 1, (7,)), gym.spaces.Discrete(7), "the observation 'obs' of shape (7,) is no image"),
    (gym.spaces.Dict({"observation": BOARD, "turn": gym.spaces.Box(0, 1, (1,))}), gym.spaces.Discrete(7),
     "the observation 'turn' of shape (1,) is no image"),
])
def test_spaces_the_mirror_does_not_fit_are_refused_naming_the_flag(obs_space, action_space, message):
    with pytest.raises(SpaceError, match="--mirror_symmetry needs images whose width is the count of a Discrete") as e:
        mirror_axes(obs_space, action_space)
    assert message in str(e.value)


def test_a_recurrent_model_is_refused():
    with pytest.raises(ConfigError, match="--mirror_symmetry=True needs a feed-forward model: use --use_rnn=False"):
        make_config(env="x", mirror_symmetry=True, use_rnn=True)


def positions(n: int, seed: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    masks = rng.integers(0, 2, (n, 7))
    masks[np.arange(n), rng.integers(0, 7, n)] = 1
    return {"observation": torch.as_tensor(rng.integers(0, 2, (n, 6, 7, 2)), dtype=torch.int8),
            MASK_KEY: torch.as_tensor(masks, dtype=torch.int8)}


def mirrored(obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"observation": obs["observation"].flip(2), MASK_KEY: obs[MASK_KEY].flip(1)}


@pytest.mark.parametrize("shared", [True, False])
def test_the_mirrored_model_is_the_mean_of_the_position_and_its_mirror_image(shared):
    torch.manual_seed(0)
    cfg = make_config(env="x", mirror_symmetry=True, actor_critic_share_weights=shared)
    model = ActorCritic(CONNECT_FOUR, gym.spaces.Discrete(7), cfg)
    plain = ActorCritic(CONNECT_FOUR, gym.spaces.Discrete(7), make_config(env="x", actor_critic_share_weights=shared))
    plain.load_state_dict(model.state_dict())  # the flag adds no weights: the same ones, run without the mirror
    obs, states = positions(16, seed=1), torch.zeros(16, 1)
    with torch.no_grad():
        params, values, next_states = model.forward_step(obs, states)
        mirror_params, mirror_values, _ = model.forward_step(mirrored(obs), states)
        # By hand: each position's logits and its mirror image's, the latter put back in column order, averaged
        # before the mask; the values averaged.
        raw = [plain.policy_head(features) for features in
               (plain._features({k: v.unsqueeze(1) for k, v in o.items()}, states, None)[0][0]
                for o in (obs, mirrored(obs)))]
        expected_values = (plain.forward_step(obs, states)[1] + plain.forward_step(mirrored(obs), states)[1]) / 2
    allowed = obs[MASK_KEY].bool()
    expected = ((raw[0] + raw[1].flip(-1)) / 2)[allowed]
    torch.testing.assert_close(params[allowed], expected)
    assert (params[~allowed] < -1e30).all()
    torch.testing.assert_close(values, expected_values)
    torch.testing.assert_close(mirror_params, params.flip(-1))  # symmetric whatever the weights
    torch.testing.assert_close(mirror_values, values)
    assert torch.equal(next_states, states)
    # The learner's sequences [n, L] give what single steps give.
    sequence = {key: x.reshape(4, 4, *x.shape[1:]) for key, x in obs.items()}
    with torch.no_grad():
        seq_params, seq_values = model.forward_sequence(sequence, torch.zeros(4, 1), torch.zeros(4, 4))
    torch.testing.assert_close(seq_params.reshape(16, 7), params)
    torch.testing.assert_close(seq_values.reshape(16), values)


def test_what_one_side_learns_holds_on_the_other():
    """A gradient step toward column 1 of a position raises column 5 of its mirror image by as much."""
    torch.manual_seed(0)
    model = ActorCritic(CONNECT_FOUR, gym.spaces.Discrete(7), make_config(env="x", mirror_symmetry=True))
    obs, states = positions(1, seed=2), torch.zeros(1, 1)
    obs[MASK_KEY][:] = 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = model.forward_step(mirrored(obs), states)[0].log_softmax(-1)[0, 5].item()
    loss = -model.forward_step(obs, states)[0].log_softmax(-1)[0, 1]
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        after = model.forward_step(mirrored(obs), states)[0].log_softmax(-1)[0, 5].item()
        trained = model.forward_step(obs, states)[0].log_softmax(-1)[0, 1].item()
    assert after > before + 0.1 and after == pytest.approx(trained, abs=1e-5)


@pytest.mark.timeout(120)
def test_an_env_the_mirror_does_not_fit_is_a_one_line_error(trainer):
    result = trainer.run("--env=CartPole-v1", "--mirror_symmetry=True", "--experiment=no_mirror", timeout=90)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert "--env=CartPole-v1: --mirror_symmetry needs images whose width is the count of a Discrete action" in \
        errors[0]
    assert "the observation 'obs' of shape (4,) is no image" in errors[0]
