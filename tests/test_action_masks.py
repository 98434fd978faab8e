"""Action masks: masked logits and the distribution over them against reference loops, the model with a mask key, the
env wrapper (a mask in info, wrong sizes, a mask that allows nothing, illegal actions counted), and the learner's
batch, whose waiting seats train the value head but not the policy."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from appo.config.cfg import make_config
from appo.envs import make_env
from appo.envs.action_masks import ActionMasks, NoLegalAction, allowed, legal_random_action, random_actions
from appo.envs.registry import EnvError, measure_step_seconds
from appo.learning.model import MASKED_LOGIT, ActionDistribution, ActorCritic, masked_logits
from appo.spaces import MASK_KEY, mask_size, masks_actions


# ---------------------------------------------------------------------------------------------- maths
def test_masked_logits_hide_disallowed_actions_part_by_part():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    mask = torch.tensor([[1, 0, 1, 0, 1]])  # parts of 3 and 2 choices
    out = masked_logits(logits, mask, [3, 2])
    assert out[0, 0] == 1.0 and out[0, 2] == 3.0 and out[0, 4] == 5.0
    assert out[0, 1] == MASKED_LOGIT and out[0, 3] == MASKED_LOGIT


def test_a_part_that_allows_nothing_is_left_unmasked():
    """A waiting seat's mask is all zeros: its logits stay finite, so nothing downstream turns into nan."""
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    out = masked_logits(logits, torch.zeros(1, 4), [2, 2])
    assert torch.equal(out, logits)
    out = masked_logits(logits, torch.tensor([[0, 0, 0, 1]]), [2, 2])
    assert torch.equal(out[0, :2], logits[0, :2]) and out[0, 2] == MASKED_LOGIT and out[0, 3] == 4.0


def reference(logits: list[float], mask: list[int]) -> tuple[list[float], float]:
    """Probabilities over the allowed actions and their entropy, by a plain loop."""
    exps = [math.exp(x) if m else 0.0 for x, m in zip(logits, mask)]
    total = sum(exps)
    probs = [e / total for e in exps]
    return probs, -sum(p * math.log(p) for p in probs if p > 0)


def test_log_probs_entropy_and_prior_kl_of_a_masked_distribution_match_a_reference_loop():
    raw = [0.3, -1.2, 2.0, 0.5, -0.1]
    mask = [1, 0, 1, 1, 0]
    params = masked_logits(torch.tensor([raw]), torch.tensor([mask]), [5])
    dist = ActionDistribution(params, [("discrete", 5)], scalar_action=True, masked=True)
    probs, entropy = reference(raw, mask)
    for action in range(5):
        log_prob = dist.log_prob(torch.tensor([action]))[0].item()
        if mask[action]:
            assert log_prob == pytest.approx(math.log(probs[action]), abs=1e-6)
        else:
            assert log_prob < -1e30
    assert dist.entropy()[0].item() == pytest.approx(entropy, abs=1e-6)
    allowed_probs = [p for p, m in zip(probs, mask) if m]
    n = len(allowed_probs)
    kl = sum(p * math.log(p * n) for p in allowed_probs) + sum(math.log(1 / n / p) / n for p in allowed_probs)
    assert dist.symmetric_kl_to_prior()[0].item() == pytest.approx(kl, abs=1e-5)
    assert torch.isfinite(dist.entropy()).all() and torch.isfinite(dist.symmetric_kl_to_prior()).all()


def test_sampling_never_picks_a_disallowed_action_even_at_the_edges():
    """The sampler's inverse CDF can land past the rounded total or at exactly 0: the allowed range catches both."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 0, 1, 1, 0, 0]] * 20000)
    params = masked_logits(torch.randn(20000, 7, generator=generator), mask, [7])
    dist = ActionDistribution(params, [("discrete", 7)], scalar_action=True, masked=True)
    counts = torch.bincount(dist.sample(generator), minlength=7)
    assert counts[[0, 2, 5, 6]].sum() == 0 and (counts[[1, 3, 4]] > 0).all()
    # A log-probability row whose exponentials sum to less than any uniform draw: the last allowed action, not
    # the last action.
    log_probs = torch.tensor([[MASKED_LOGIT, math.log(0.25), math.log(0.25), MASKED_LOGIT]])
    dist = ActionDistribution(log_probs, [("discrete", 4)], scalar_action=True, masked=True)
    assert {dist.sample().item() for _ in range(200)} <= {1, 2}
    assert dist.mode().item() in (1, 2)


def test_multidiscrete_masks_apply_to_each_part():
    mask = torch.tensor([[0, 1, 1, 0, 0]] * 2000)  # part 0: action 1 only of 2; part 1: action 0 of 3
    params = masked_logits(torch.randn(2000, 5), mask, [2, 3])
    dist = ActionDistribution(params, [("discrete", 2), ("discrete", 3)], scalar_action=False, masked=True)
    actions = dist.sample()
    assert (actions[:, 0] == 1).all() and (actions[:, 1] == 0).all()
    assert torch.allclose(dist.entropy(), torch.zeros(2000), atol=1e-6)


def test_a_multidiscrete_of_two_axes_is_masked_part_by_part_in_numpys_order():
    """MultiDiscrete([[2, 3], [2, 2]], start=1): four parts, their mask entries one part after another as the model's
    logits lie; a random legal action comes back in the space's shape, from its start."""
    space = gym.spaces.MultiDiscrete([[2, 3], [2, 2]], start=[[1, 1], [1, 1]])
    assert mask_size(space) == 9
    mask = np.array([0, 1, 1, 0, 0, 1, 0, 0, 1])  # part (0,0): choice 1; (0,1): 0; (1,0): 0; (1,1): 1
    legal = np.array([[2, 1], [1, 2]])
    for seed in range(5):
        action = legal_random_action(space, mask, np.random.default_rng(seed))
        assert action.shape == (2, 2) and np.array_equal(action, legal) and space.contains(action)
    assert allowed(mask, [2, 3, 2, 2], legal, space.start)
    assert not allowed(mask, [2, 3, 2, 2], np.array([[1, 1], [1, 2]]), space.start)


# ---------------------------------------------------------------------------------------------- spaces and model
MASKED_SPACE = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (4,), np.float32),
                                MASK_KEY: gym.spaces.Box(0, 1, (3,), np.int8)})


def test_masking_follows_the_flag_and_the_mask_size_the_action_space():
    assert masks_actions("auto", MASKED_SPACE) and not masks_actions("none", MASKED_SPACE)
    assert mask_size(gym.spaces.MultiDiscrete([2, 3])) == 5
    with pytest.raises(TypeError, match="Discrete or MultiDiscrete"):
        mask_size(gym.spaces.Box(-1, 1, (2,)))


def test_the_model_masks_its_policy_and_still_values_every_row():
    torch.manual_seed(0)
    model = ActorCritic(MASKED_SPACE, gym.spaces.Discrete(3), make_config(env="x"))
    assert model.masked and set(model.trunks[0]["encoder"].encoders) == {"obs", MASK_KEY}  # whose turn it is, too
    obs = {"obs": torch.randn(6, 4), MASK_KEY: torch.tensor([[1, 0, 0], [0, 1, 1], [1, 1, 1], [0, 0, 1],
                                                              [0, 0, 0], [1, 0, 1]])}
    params, values, _ = model.forward_step(obs, torch.zeros(6, 1))
    dist = model.distribution(params)
    modes = dist.mode().tolist()
    assert modes[0] == 0 and modes[1] in (1, 2) and modes[3] == 2 and modes[5] in (0, 2)
    assert torch.isfinite(values).all() and torch.isfinite(dist.entropy()).all()
    unmasked = ActorCritic(MASKED_SPACE, gym.spaces.Discrete(3), make_config(env="x", action_mask="none"))
    assert not unmasked.masked and set(unmasked.trunks[0]["encoder"].encoders) == {"obs", MASK_KEY}


# ---------------------------------------------------------------------------------------------- the env wrapper
class InfoMaskEnv(gym.Env):
    """Discrete(3) whose info says which actions are allowed: action k is allowed at steps where t % 3 != k; at step
    `empty_at` the mask allows nothing."""

    def __init__(self, empty_at: int = -1, size: int = 3):
        self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.empty_at, self.size, self.t = empty_at, size, 0

    def _info(self) -> dict:
        mask = np.ones(self.size, dtype=np.int8)
        mask[self.t % 3] = 0
        if self.t == self.empty_at:
            mask[:] = 0
        return {"legal": mask}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), self._info()

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 0.0, False, self.t >= 10, self._info()


def test_a_mask_in_info_moves_into_the_observation_and_illegal_actions_are_counted():
    env = ActionMasks(InfoMaskEnv(), ("info", "legal"), "info_mask")
    assert set(env.observation_space.spaces) == {"obs", MASK_KEY}
    obs, _ = env.reset()
    assert obs[MASK_KEY].tolist() == [0, 1, 1]
    obs, *_ = env.step(0)  # not allowed at step 0
    assert env.take_illegal() == 1 and obs[MASK_KEY].tolist() == [1, 0, 1]
    env.step(0)  # allowed at step 1
    assert env.take_illegal() == 0


def test_a_mask_that_allows_nothing_stops_with_the_env_and_the_step():
    env = ActionMasks(InfoMaskEnv(empty_at=4), ("info", "legal"), "info_mask")
    env.reset()
    for _ in range(3):
        env.step(2)
    with pytest.raises(NoLegalAction, match=r"--env=info_mask: action mask allows no action at step 4 of an episode"):
        env.step(2)


def test_wrong_mask_sizes_and_missing_info_keys_are_one_line_errors():
    env = ActionMasks(InfoMaskEnv(size=4), ("info", "legal"), "wrong_size")
    with pytest.raises(EnvError, match=r"--env=wrong_size: an action mask of 4 entries .* needs 3"):
        env.reset()
    env = ActionMasks(InfoMaskEnv(), ("info", "other"), "no_key")
    with pytest.raises(EnvError, match=r"reads info\['other'\], which step 0 of an episode lacks"):
        env.reset()
    with pytest.raises(EnvError, match="Discrete or MultiDiscrete"):
        ActionMasks(gym.make("Pendulum-v1"), ("info", MASK_KEY), "Pendulum-v1")


def test_taxi_masks_from_info_through_make_env():
    """gymnasium's Taxi gives info['action_mask']: --action_mask=info masks it; the default leaves Taxi as it was."""
    env = make_env("Taxi-v4", action_mask="info")
    obs, _ = env.reset(seed=0)
    assert obs[MASK_KEY].shape == (6,) and obs["obs"].shape == (500,)
    rng = np.random.default_rng(0)
    for _ in range(50):
        obs, _, terminated, truncated, _ = env.step(legal_random_action(env.action_space, obs[MASK_KEY], rng))
        if terminated or truncated:
            obs, _ = env.reset()
    assert env.take_illegal() == 0
    assert isinstance(make_env("Taxi-v4").observation_space, gym.spaces.Box)


def test_allowed_reads_multidiscrete_parts():
    sizes = [2, 3]
    mask = np.array([0, 1, 1, 0, 1])
    assert allowed(mask, sizes, [1, 0]) and allowed(mask, sizes, [1, 2])
    assert not allowed(mask, sizes, [0, 0]) and not allowed(mask, sizes, [1, 1])
    # the env's actions numbered from a start (MultiDiscrete(..., start=[1, -1])): its [2, -1] is the mask's [1, 0]
    assert allowed(mask, sizes, [2, -1], starts=np.array([1, -1])) and not allowed(mask, sizes, [1, -1], [1, -1])
    space = gym.spaces.MultiDiscrete([2, 3], start=[1, -1])
    rng = np.random.default_rng(0)
    assert all(allowed(mask, sizes, legal_random_action(space, mask, rng), space.start) for _ in range(20))
    assert all(space.contains(legal_random_action(space, mask, rng)) for _ in range(20))


def test_bad_mask_flags_are_one_line_errors(trainer):
    from appo.config.cfg import ConfigError

    with pytest.raises(ConfigError, match=r"--action_mask=obs: unknown; use auto, info, info:KEY"):
        make_config(env="x", action_mask="obs")
    result = trainer.run("--env=CartPole-v1", "--action_mask=info", "--experiment=no_mask", timeout=60)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "--env=CartPole-v1: --action_mask reads info['action_mask'], which step 0 of an " \
                                "episode lacks" in errors[0], result.stderr
    # Taxi's mask, read by default, cannot come from a vector env's infos: refused, both ways out named
    result = trainer.run("--env=Taxi-v4", "--batched_sampling=True", "--experiment=batched_mask", timeout=60)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert "--action_mask=info (the default where the env's reset info holds a mask): batched sampling" in errors[0]
    assert "--batched_sampling=False, or --action_mask=none" in errors[0]


def test_an_env_with_a_mask_in_its_reset_info_gets_it_read_by_default():
    from appo.launch import new_experiment_defaults

    cfg, lines = new_experiment_defaults(["--env=Taxi-v4"])
    assert cfg.action_mask == "info"
    assert any(line.startswith("auto: --action_mask=info (the env gives an action mask in info['action_mask']")
               for line in lines), lines
    assert "auto: encoder mlp for observation 'action_mask' (6 vector)" in lines, lines
    cfg, lines = new_experiment_defaults(["--env=Taxi-v4", "--action_mask=none"])
    assert cfg.action_mask == "none" and not any("action_mask" in line for line in lines)
    cfg, _ = new_experiment_defaults(["--env=CartPole-v1"])
    assert cfg.action_mask == "auto"


def test_random_play_takes_legal_moves_and_counts_the_seats_that_move():
    """As the raw limit, the start-up step timing and the decorrelating steps play."""
    space, rng = gym.spaces.Discrete(4), np.random.default_rng(0)
    turn = {"action_mask": np.array([[0, 1, 0, 1], [0, 0, 0, 0]], dtype=np.int8)}  # seat 1 waits for its turn
    for _ in range(20):
        (mover, waiting), acting = random_actions(space, turn, 2, rng)
        assert mover in (1, 3) and waiting == 0 and acting == 1
    actions, acting = random_actions(space, {"obs": np.zeros(3)}, 2, rng)  # no mask: every agent acts
    assert len(actions) == 2 and all(0 <= a < 4 for a in actions) and acting == 2
    assert random_actions(space, np.zeros(3), 1, rng)[1] == 1



def test_the_start_up_step_timing_plays_legal_moves():
    """Random columns would end connect four at the first illegal one, with PettingZoo's warning on every run."""
    pytest.importorskip("pettingzoo")
    env = make_env("pettingzoo.classic.connect_four_v3:env")
    measure_step_seconds(env, num_agents=2, max_steps=100, budget_s=60.0)
    assert env.take_illegal() == 0
