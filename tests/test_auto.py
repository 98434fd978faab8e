"""Defaults chosen from the task (appo/config/auto.py): which rule fires for which env, given flags win, the env's
step cost is measured, and a real run logs and saves its choices."""

import dataclasses
import importlib.util
import json
import logging
import os
import time

import gymnasium as gym
import numpy as np
import pytest

from appo.config import auto
from appo.config.cfg import build_parser, parse_args
from appo.envs import EnvInfo, env_info
from appo.envs.registry import random_game_moves
from appo.launch import new_experiment_defaults
from tests.conftest import final_reward
from tests.space_envs import ACTIONS, OBS

VECTOR, IMAGE = OBS["vector"], OBS["image"]
# The noise probe's answer for a task where noise ends no episode early (False), where a body falls whatever the noise
# (True), and where the probe failed or did not run (None)
PROBED = {False: (0, None), True: (110, 80), None: None}


def cfg_of(*flags: str):
    return parse_args(["--env=unused", *flags])[0]


def info(obs_space, step_seconds: float | None = 1e-5, action: str = "discrete") -> EnvInfo:
    return EnvInfo(obs_space, ACTIONS[action], step_seconds=step_seconds)


def test_vector_observations_and_cheap_steps_keep_the_defaults():
    cfg, defaults = cfg_of(), cfg_of()
    cfg, lines = auto.apply(cfg, set(), info(VECTOR))
    assert cfg == defaults
    assert lines == ["auto: encoder mlp for observation 'obs' (5 vector)"]


def test_images_train_each_sample_once_unless_told_otherwise():
    cfg = cfg_of("--ppo_epochs=3")
    cfg, lines = auto.apply(cfg, {"ppo_epochs"}, info(IMAGE))
    assert cfg.ppo_epochs == 3  # given on the command line: wins
    for name, value in auto.IMAGE_LEARNING.items():
        if name != "ppo_epochs":
            assert getattr(cfg, name) == value
    assert any("--gamma=0.99" in line and "--ppo_epochs" not in line and "image observations" in line for line in lines)
    assert "auto: encoder nature_cnn for observation 'obs' (36x36 images, 3 channels first)" in lines
    assert not any("trained on once" in line for line in lines)  # the line says only what holds
    _, lines = auto.apply(cfg_of(), set(), info(IMAGE))
    assert any("--ppo_epochs=1" in line and "each sample is trained on once" in line for line in lines)


@pytest.mark.parametrize("shape", [(10, 10, 10), (6, 7, 2), (4, 35, 80)])
def test_small_images_keep_the_passes_of_vectors(shape):
    """MinAtar's grids and game boards: the other image values, and the default passes; an image with a side of 36
    pixels beside them makes every sample's single pass the rule again."""
    small = gym.spaces.Box(0, 255, shape, np.uint8)
    cfg, lines = auto.apply(cfg_of(), set(), info(small))
    assert cfg.ppo_epochs == cfg_of().ppo_epochs == 4
    for name in set(auto.IMAGE_LEARNING) - set(auto.SMALL_IMAGE_KEEPS):
        assert getattr(cfg, name) == auto.IMAGE_LEARNING[name]
    assert any("small image observations" in line and "--ppo_epochs" not in line.split("(")[0] for line in lines)
    both = gym.spaces.Dict({"board": small, "camera": IMAGE})
    assert auto.apply(cfg_of(), set(), info(both))[0].ppo_epochs == 1


def test_passes_follow_the_machine_only_when_asked_and_then_say_so():
    cfg, lines = auto.apply(cfg_of(), set(), info(VECTOR))
    assert not cfg.adaptive_epochs and not any("passes" in line for line in lines)
    cfg, lines = auto.apply(cfg_of("--adaptive_epochs=True"), {"adaptive_epochs"}, info(VECTOR))
    assert cfg.adaptive_epochs
    assert any("up to 4 passes" in line and "follow this machine's speed" in line for line in lines)


@pytest.mark.parametrize("device,gpus,native,given,hint", [
    ("cuda", 1, True, (), False), ("cuda:0", 1, True, (), False), ("auto", 1, True, (), False),
    ("auto", 0, True, (), True), ("cpu", 1, True, (), True), ("cpu", 0, False, (), False),
    ("cpu", 0, True, ("learner_bf16",), False)])
def test_numerics_are_float32_unless_given_and_a_bfloat16_cpu_is_told_of_the_flags(monkeypatch, device, gpus, native,
                                                                                 given, hint):
    """No timing chooses bfloat16 (it learns differently): float32 unless a flag says otherwise. Where the CPU that
    learns and infers has native bfloat16, a line names the flags; on CUDA they do nothing, so no line. A config
    decision: no GPU needed, the devices torch would see are given."""
    monkeypatch.setattr(auto, "cpu_has_bf16", lambda: native)
    monkeypatch.setattr(auto, "cuda_device_count", lambda: gpus)
    cfg = cfg_of(f"--device={device}", *(f"--{name}=True" for name in given))
    cfg, lines = auto.apply(cfg, {"device", *given}, info(IMAGE))
    assert (cfg.learner_bf16, cfg.inference_bf16) == ("learner_bf16" in given, False)
    assert any("--learner_bf16=True and --inference_bf16=True" in line for line in lines) == hint
    assert not any("bfloat16" in line for line in auto.apply(cfg_of("--device=cpu"), {"device"}, info(VECTOR))[1])


@pytest.mark.slow
def test_a_machine_without_gpu_device_files_has_no_cuda_device_without_importing_torch(monkeypatch):
    from appo.utils import resources

    monkeypatch.setattr(resources.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(resources.subprocess, "run", lambda *args, **kwargs: pytest.fail("probed a child"))
    assert resources.cuda_device_count() == 0


@pytest.mark.parametrize("action,bonus", [("box", 0.0), ("tuple", None), ("discrete", None)])
def test_continuous_actions_drop_the_entropy_bonus(action, bonus):
    """Only when every action part is a Box; over the image rule's bonus too; a given coefficient wins."""
    default = cfg_of().exploration_loss_coeff
    for obs, otherwise in ((VECTOR, default), (IMAGE, auto.IMAGE_LEARNING["exploration_loss_coeff"])):
        cfg, lines = auto.apply(cfg_of(), set(), info(obs, action=action))
        assert cfg.exploration_loss_coeff == (otherwise if bonus is None else bonus)
        assert any(line.startswith("auto: --exploration_loss_coeff=0.0 (continuous actions") for line in lines) == (
            bonus is not None)
    cfg, _ = auto.apply(cfg_of("--exploration_loss_coeff=0.02"), {"exploration_loss_coeff"},
                        info(VECTOR, action=action))
    assert cfg.exploration_loss_coeff == 0.02


@pytest.mark.parametrize("action,separate", [("box", True), ("tuple", False), ("discrete", False)])
def test_continuous_actions_on_vectors_give_the_critic_its_own_mlp(action, separate):
    """Vectors only (images keep one CNN); a given --actor_critic_share_weights wins."""
    for obs, expected in ((VECTOR, separate), (IMAGE, False)):
        cfg, lines = auto.apply(cfg_of(), set(), info(obs, action=action))
        assert cfg.actor_critic_share_weights == (not expected)
        assert any(line.startswith("auto: --actor_critic_share_weights=False (continuous actions on vectors")
                   for line in lines) == expected
    cfg, lines = auto.apply(cfg_of("--actor_critic_share_weights=True"), {"actor_critic_share_weights"},
                            info(VECTOR, action=action))
    assert cfg.actor_critic_share_weights
    assert not any("actor_critic_share_weights" in line for line in lines)


@pytest.mark.parametrize("obs,action,terminates,std,box", [
    ("vector", "box", False, 0.707, None), ("vector", "box6", False, 0.408, None),
    ("vector", "box1", False, None, None), ("vector", "box", True, None, None), ("vector", "box", None, None, None),
    ("vector", "discrete", False, None, None),
    ("vector", "tuple", False, None, None), ("image", "box", False, None, None),
    ("vector", "humanoid", True, None, "17 of 17 dimensions start at std 0.4, their half width, not 1"),
    ("vector", "humanoid", False, 0.243, None),  # 1/sqrt(17) is narrower than the box
    ("vector", "narrow1", None, None, "1 of 1 dimensions start at std 0.1"),
    ("vector", "one_narrow_part", True, None, "mean starts at the action box's centre (0, 0.25); 1 of 2 dimensions "
                                              "start at std 0.25"),
    ("vector", "unbounded", True, None, None),
    ("image", "humanoid", True, None, "17 of 17 dimensions start at std 0.4")])
def test_continuous_actions_start_narrow_where_noise_never_ends_episodes_early(obs, action, terminates, std, box):
    """Continuous actions on vectors where noise ended no episode but by a time limit: std 1/sqrt(action
    dimensions), so a single action keeps std 1; otherwise unchanged; a given --initial_stddev wins. A box that
    changes where the model starts its Gaussian (appo.spaces.initial_stds) is said in a line, given flag or not."""
    spaces = {"box6": gym.spaces.Box(-1.0, 1.0, (6,), np.float32), "box1": gym.spaces.Box(-2.0, 2.0, (1,), np.float32),
              "humanoid": gym.spaces.Box(-0.4, 0.4, (17,), np.float32),
              "narrow1": gym.spaces.Box(-0.1, 0.1, (1,), np.float32),
              "one_narrow_part": gym.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 0.5]), dtype=np.float32),
              "unbounded": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)}
    probed = EnvInfo(OBS[obs], spaces.get(action) or ACTIONS[action], noise_terminations=PROBED[terminates])
    cfg, lines = auto.apply(cfg_of(), set(), probed)
    assert cfg.initial_stddev == (std or cfg_of().initial_stddev)
    narrowed = [line for line in lines if line.startswith(f"auto: --initial_stddev={std} (")]
    assert narrowed if std else not any("initial_stddev" in line for line in lines)
    assert any(box in line for line in lines) if box else not any("dimensions start at" in line for line in lines)
    cfg, lines = auto.apply(cfg_of("--initial_stddev=0.8"), {"initial_stddev"}, probed)
    assert cfg.initial_stddev == 0.8 and not any("initial_stddev" in line for line in lines)
    assert any((box or "").replace("not 1", "not 0.8") in line for line in lines)


@pytest.mark.parametrize("probed, narrow", [((0, None), True), ((20, 4), True), ((20, 10), True), ((20, 11), False),
                                            ((110, 80), False), (None, False)])
def test_the_narrow_start_where_the_wide_noise_itself_ends_the_episodes(probed, narrow):
    """Early ends under noise at std 1 and at 1/sqrt(dims): narrow where the wide noise ends none, or at least twice
    as many as the narrow one (Ant, 20 against 4); std 1 where a body falls whatever the noise (Walker2d, 110 and 80)
    or the probe failed."""
    box6 = EnvInfo(VECTOR, gym.spaces.Box(-1.0, 1.0, (6,), np.float32), noise_terminations=probed)
    cfg, lines = auto.apply(cfg_of(), set(), box6)
    assert cfg.initial_stddev == (0.408 if narrow else 1.0)
    if narrow:
        ended = "ended no episode early" if not probed[0] else f"ended {probed[0]} episodes early at std 1 and " \
                                                               f"{probed[1]} at std 0.408"
        assert any(line.startswith("auto: --initial_stddev=0.408 (") and ended in line for line in lines), lines


def test_noise_is_probed_only_where_the_rule_may_apply():
    from appo.envs.registry import noise_terminations

    assert noise_terminations("Pendulum-v1", None, 0.5) == (0, None)  # a time limit of 200 steps ends every episode
    wide, narrow = noise_terminations("InvertedPendulum-v5", None, 0.5)  # the pole drops within a few steps
    assert wide > 100 and narrow > 0
    assert noise_terminations("Pendulum-v1", None, 0.5, max_steps=50) == (0, None)
    assert noise_terminations("no_such_env", None, 0.5) is None
    box = info(VECTOR, action="box")
    assert auto.probes_noise(cfg_of(), box, set())
    assert not auto.probes_noise(cfg_of(), box, {"initial_stddev"})
    assert not auto.probes_noise(cfg_of(), info(VECTOR), set())
    assert not auto.probes_noise(cfg_of(), info(IMAGE, action="box"), set())
    one_action = EnvInfo(VECTOR, gym.spaces.Box(-2.0, 2.0, (1,), np.float32))  # keeps std 1 either way
    assert not auto.probes_noise(cfg_of(), one_action, set())


def test_the_noise_is_the_untrained_models_gaussian_clipped_to_the_box():
    from appo.envs.registry import gaussian_sampler

    rng = np.random.default_rng(0)
    offset = gym.spaces.Box(np.array([0.9, -1.0, 2.0]), np.array([1.0, 1.0, 2.0]), dtype=np.float32)
    sample = gaussian_sampler(offset, 0.5)
    samples = np.array([sample(rng) for _ in range(4000)])
    assert np.all(samples >= offset.low) and np.all(samples <= offset.high) and samples.dtype == np.float32
    assert abs(samples[:, 0].mean() - 0.95) < 0.005 and samples[:, 0].std() < 0.05  # centred, std its half width
    assert abs(samples[:, 1].std() - 0.5) < 0.03  # std 0.5 on [-1, 1]: few clipped
    assert np.all(samples[:, 2] == 2.0)  # zero width: its one value
    parts = gym.spaces.Tuple((offset, gym.spaces.Box(-1.0, 1.0, (2,), np.float32)))
    assert [part.shape for part in gaussian_sampler(parts, 1.0)(rng)] == [(3,), (2,)]


class FallingEnv(gym.Env):
    """Two continuous actions; a body that falls at step `falls_at` (None: only a time limit of 20 steps ends an
    episode), each step taking `step_seconds`: the noise probe on a slow and a fast machine."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, falls_at: int | None = None, step_seconds: float = 0.0):
        self.falls_at, self.step_seconds, self.t = falls_at, step_seconds, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        time.sleep(self.step_seconds)
        self.t += 1
        return np.zeros(3, np.float32), 0.0, self.t == self.falls_at, self.t >= 20, {}


def make_falling_env(**kwargs) -> FallingEnv:
    return FallingEnv(**kwargs)


@pytest.mark.parametrize("falls_at", [15, None])
def test_the_noise_probe_answers_the_same_on_a_slow_machine_and_says_it_was_slow(monkeypatch, caplog,
                                                                                       falls_at):
    """The probe plays every step however long they take (no time limit that would leave std 1 on a loaded machine),
    and one that takes over SLOW_PROBE_S logs why start-up waited."""
    from appo.envs import registry

    monkeypatch.setattr(registry, "SLOW_PROBE_S", 0.3)  # the fast probe takes milliseconds, even on a loaded machine
    caplog.set_level(logging.INFO, logger="appo")
    logger = logging.getLogger("appo")
    logger.addHandler(caplog.handler)  # appo's logger does not propagate once a run has set it up
    try:
        answers = [registry.noise_terminations("tests.test_auto:make_falling_env",
                                               {"falls_at": falls_at, "step_seconds": seconds}, 0.5, max_steps=40)
                   for seconds in (0.0, 0.02)]  # 0.8 s at one std, 1.6 s at both: over the 0.3 s
    finally:
        logger.removeHandler(caplog.handler)
    assert answers == [(2, 2) if falls_at else (0, None)] * 2  # falls at step 15 of each 20-step episode
    slow = {record.getMessage() for record in caplog.records if record.getMessage().startswith("Noise probe")}
    assert len(slow) == 1 and "40 steps of tests.test_auto:make_falling_env at std 1 and 0.5 took" in slow.pop()


LEARNING_INDEPENDENT = {"num_envs_per_worker", "actor_niceness"}  # the sampler's sizing: a timing may set them


@pytest.mark.parametrize("obs,action,terminates", [("vector", "box", False), ("vector", "box", True),
                                                   ("vector", "discrete", None), ("image", "discrete", None),
                                                   ("image", "box", None)])
def test_a_slow_and_a_fast_machine_learn_with_the_same_values(monkeypatch, obs, action, terminates):
    """The same task timed at 1 us and 20 ms an env step (a fast server, a loaded laptop), on a CPU with native
    bfloat16 that learns: the same minibatches, learning rate, epochs, numerics and std; only the sampler's sizing
    differs. The probe's answer comes from its steps, never its time (the test above)."""
    monkeypatch.setattr(auto, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(auto, "cuda_device_count", lambda: 0)
    chosen = []
    for seconds in (1e-6, 0.02):
        task = dataclasses.replace(info(OBS[obs], step_seconds=seconds, action=action),
                                   noise_terminations=PROBED[terminates])
        cfg, _ = auto.apply(cfg_of("--device=cpu"), {"device"}, task)
        chosen.append({name: value for name, value in dataclasses.asdict(cfg).items()
                       if name not in LEARNING_INDEPENDENT})
    assert chosen[0] == chosen[1]
    assert not chosen[0]["learner_bf16"] and not chosen[0]["inference_bf16"]


@pytest.mark.parametrize("env,narrow", [
    ("Swimmer-v5", 0.707),  # 2 joints, and only the time limit ends its episodes
    ("Humanoid-v5", 1.0)])  # it falls under random play (its box of [-0.4, 0.4] caps the std in the model)
def test_a_new_run_saves_the_narrow_start_and_a_resumed_one_keeps_it(tmp_path, monkeypatch, env, narrow):
    from appo import launch

    def start(*flags: str):
        cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=exp", f"--env={env}", *flags])
        return launch.prepare(cfg, given)[0]

    assert start().initial_stddev == narrow
    with open(tmp_path / "exp" / "cfg.json") as f:
        assert json.load(f)["initial_stddev"] == narrow
    monkeypatch.setattr(launch, "noise_terminations", lambda *args: pytest.fail("probed on resume"))
    assert start().initial_stddev == narrow


def test_a_given_encoder_is_not_announced():
    lines = auto.apply(cfg_of("--encoder=mlp"), {"encoder"}, info(VECTOR))[1]
    assert not any("encoder" in line for line in lines)


@pytest.mark.parametrize("workers,inference_workers,expected", [(2, 1, 32), (1, 1, 32), (4, 1, 16), (8, 2, 16),
                                                                 (64, 1, 8)])
def test_costly_env_steps_size_the_inference_batch(workers, inference_workers, expected):
    cfg = cfg_of(f"--num_workers={workers}", f"--policy_workers_per_policy={inference_workers}")
    cfg, lines = auto.apply(cfg, {"num_workers", "policy_workers_per_policy"}, info(VECTOR, step_seconds=5e-4))
    assert cfg.num_envs_per_worker == expected
    assert cfg.num_envs_per_worker % cfg.worker_num_splits == 0
    assert cfg.actor_niceness == auto.COSTLY_ACTOR_NICENESS
    assert any(f"--num_envs_per_worker={expected} --actor_niceness=5 (0.50 ms per env step" in line for line in lines)


@pytest.mark.parametrize("agents,expected", [(2, 16), (8, 4), (32, 2)])
def test_a_multi_agent_env_counts_each_agent_as_an_observation_of_the_batch(agents, expected):
    multi_agent = dataclasses.replace(info(VECTOR, step_seconds=5e-4), num_agents=agents)
    cfg, lines = auto.apply(cfg_of("--num_workers=2"), {"num_workers"}, multi_agent)
    assert cfg.num_envs_per_worker == expected  # 32 observations / (2 actors x agents), per split of 2, at least 1
    assert any(f"2 actors x {agents} agents per inference worker" in line for line in lines)


def test_given_envs_per_worker_win_over_the_step_cost():
    cfg, lines = auto.apply(cfg_of("--num_envs_per_worker=6", "--actor_niceness=0"),
                            {"num_envs_per_worker", "actor_niceness"}, info(VECTOR, step_seconds=5e-4))
    assert lines == ["auto: encoder mlp for observation 'obs' (5 vector)"]
    assert (cfg.num_envs_per_worker, cfg.actor_niceness) == (6, 0)


@pytest.mark.parametrize("flags, fast", [
    (["--env=CartPole-v1", "--batched_sampling=True"], True),  # gymnasium's vector entry point
    (["--env=envpool:CartPole-v1"], True),  # EnvPool is always batched
    (["--env=envpool:HalfCheetah-v5"], True),  # slower sub-envs, the same values
    (["--env=Acrobot-v1", "--batched_sampling=True"], False),  # a SyncVectorEnv of Python envs
    (["--env=CartPole-v1"], False),  # per-env sampling
])
def test_natively_vectorised_envs_give_the_learner_bigger_minibatches_at_any_speed(flags, fast):
    defaults = cfg_of()
    for sub_env_seconds in (1e-6, 0.02):  # a fast machine, and a loaded one or a costly env
        cfg, lines = auto.apply(cfg_of(*flags), set(), info(VECTOR, step_seconds=sub_env_seconds))
        assert (cfg.batch_size, cfg.learning_rate) == ((auto.FAST_BATCHED["batch_size"],
                                                        auto.FAST_BATCHED["learning_rate"]) if fast else
                                                       (defaults.batch_size, defaults.learning_rate))
        assert any("natively vectorised" in line for line in lines) == fast
        if fast:  # the splits' sub-envs are the rule's; a costly step only adds the actors' niceness
            assert cfg.num_envs_per_worker == auto.FAST_BATCHED_ENVS_PER_SPLIT * cfg.worker_num_splits
            assert cfg.actor_niceness == (auto.COSTLY_ACTOR_NICENESS if sub_env_seconds >= auto.COSTLY_STEP_S else 0)
            assert sum("--num_envs_per_worker" in line for line in lines) == 1
    given, _ = auto.apply(cfg_of("--env=CartPole-v1", "--batched_sampling=True", "--learning_rate=0.0005"),
                          {"learning_rate"}, info(VECTOR))
    assert (given.learning_rate, given.batch_size) == (0.0005, auto.FAST_BATCHED["batch_size"])
    images, _ = auto.apply(cfg_of("--env=envpool:Pong-v5"), set(), info(IMAGE))
    assert images.learning_rate == auto.IMAGE_LEARNING["learning_rate"] and images.batch_size == defaults.batch_size


def test_batched_runs_measure_a_sub_env_step():
    from appo.envs.vector import natively_vectorised, sub_env_step_seconds

    vectorised = sub_env_step_seconds("CartPole-v1")  # gymnasium's vector entry point, in numpy
    python_loop = sub_env_step_seconds("sleep_env", {"step_seconds": 0.001})  # a SyncVectorEnv: one after another
    assert vectorised < auto.COSTLY_STEP_S
    assert 0.001 <= python_loop < 0.01
    if importlib.util.find_spec("envpool"):  # classic control against MuJoCo
        fast, slow = sub_env_step_seconds("envpool:Acrobot-v1"), sub_env_step_seconds("envpool:HalfCheetah-v4")
        # Far apart on any machine, a slower one scaling both: 1.1-1.4 us against 17-20 us on a Zen 4 EPYC. (MuJoCo's
        # InvertedPendulum, 6-9 us there, came within 3x of Acrobot once in three runs.)
        assert slow > 3 * fast
    # Start-up measures the vectorised step only where it is native; a SyncVectorEnv's sub-env costs a per-env step.
    assert natively_vectorised("CartPole-v1") and natively_vectorised("envpool:CartPole-v1")
    assert not natively_vectorised("sleep_env") and not natively_vectorised("Acrobot-v1")


def test_no_measurement_no_sizing():
    cfg, _ = auto.apply(cfg_of(), set(), info(VECTOR, step_seconds=None))
    assert cfg.num_envs_per_worker == cfg_of().num_envs_per_worker


def test_step_cost_is_measured():
    measured = env_info("sleep_env", {"step_seconds": 0.002}, measure_step=True).step_seconds
    assert 0.002 <= measured < 0.02
    assert env_info("sleep_env", {"step_seconds": 0.002}).step_seconds is None


def test_turn_based_games_start_training_games_after_random_moves_unless_told_otherwise():
    turns = dataclasses.replace(info(IMAGE), num_agents=2, turn_based=True, random_game_moves=20.8)  # connect four
    cfg, lines = auto.apply(cfg_of(), set(), turns)
    assert cfg.random_opening_moves == 6
    assert any(line.startswith("auto: --random_opening_moves=6 (a turn-based game: each training game starts after 0 "
                               "to 6 random legal moves, 0.3 of a random game's 20.8,") for line in lines), lines
    for moves, expected in ((7.7, 2), (2.0, 1), (None, auto.FALLBACK_OPENING_MOVES)):  # tic-tac-toe, a short game
        cfg, lines = auto.apply(cfg_of(), set(), dataclasses.replace(turns, random_game_moves=moves))
        assert cfg.random_opening_moves == expected
    assert any("(the probe of its length failed)" in line for line in lines)
    cfg, lines = auto.apply(cfg_of("--random_opening_moves=0"), {"random_opening_moves"}, turns)
    assert cfg.random_opening_moves == 0 and not any("turn-based" in line for line in lines)
    cfg, _ = auto.apply(cfg_of(), set(), dataclasses.replace(info(IMAGE), num_agents=2))  # simultaneous moves
    assert cfg.random_opening_moves == 0


def test_a_random_games_length_is_probed_by_moves_not_seconds():
    pytest.importorskip("pettingzoo")
    tictactoe = random_game_moves("pettingzoo.classic.tictactoe_v3:env", None)
    assert 5 < tictactoe < 9 and random_game_moves("pettingzoo.classic.tictactoe_v3:env", None) == tictactoe
    assert 15 < random_game_moves("pettingzoo.classic.connect_four_v3:env", None, max_moves=500) < 30
    assert random_game_moves("pettingzoo.classic.no_such_game:env", None) is None
    _, lines = new_experiment_defaults(["--env=pettingzoo.classic.connect_four_v3:env"])
    assert any(line.startswith("auto: --random_opening_moves=6 ") for line in lines), lines


def test_every_rule_is_in_the_help():
    text = " ".join(build_parser().format_help().split())
    for name in (*auto.IMAGE_LEARNING, *auto.FAST_BATCHED, "random_opening_moves", "initial_stddev",
                 "num_envs_per_worker", "actor_niceness"):
        assert auto.flag_help(name) and " ".join(auto.flag_help(name).split()) in text
    assert not auto.flag_help("learner_bf16") and not auto.flag_help("inference_bf16")  # float32 unless given


@pytest.mark.slow
@pytest.mark.timeout(300)  # a budget of env steps: 60-90 s on the Xeon, longer on CPUs without bfloat16
@pytest.mark.parametrize("size", [10, 16])
def test_small_images_train_with_the_default_encoder(trainer, size):
    """Images smaller than the Nature CNN takes get the small CNN, say so, save the image rules, and learn: the
    env pays 1 per step for action 0 (random play: 1/3 of the 20 steps)."""
    kwargs = json.dumps({"obs": "small_image", "image_size": size})
    result = trainer.run("--env=tests.space_envs:make_spaces_env", f"--env_kwargs={kwargs}", f"--experiment=img{size}",
                         "--train_for_env_steps=60000", "--num_workers=1", "--num_envs_per_worker=8",
                         "--report_interval=1", "--decorrelate_envs_on_one_worker=False", timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (f"auto: encoder small_cnn for observation 'obs' ({size}x{size} images, 4 channels last, smaller than"
            in result.stderr)
    with open(os.path.join(trainer.train_dir, f"img{size}", "cfg.json")) as f:
        saved = json.load(f)
    assert (saved["ppo_epochs"], saved["gamma"]) == (4, 0.99)  # small images keep the passes of vectors
    assert final_reward(trainer.train_dir, f"img{size}") > 12
