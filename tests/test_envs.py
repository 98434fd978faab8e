"""Env families through the whole trainer: user envs, every space combination, multi-agent."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from appo.envs import make_env
from appo.learning.checkpoint import checkpoint_dir, latest_checkpoint, parse_name
from appo.learning.trained_policy import load_policy
from appo.tools.export import ExportedModel, export_policy, onnx_difference
from tests.conftest import REPO, final_reward
from tests.space_envs import ACTIONS, OBS

pytestmark = pytest.mark.slow  # every test here starts a trainer or trains

SMALL = ["--num_workers=1", "--num_envs_per_worker=4", "--report_interval=1", "--batch_size=256",
         "--num_batches_per_iteration=1",
         "--decorrelate_envs_on_one_worker=False"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("obs", list(OBS))
@pytest.mark.parametrize("action", list(ACTIONS))
def test_every_space_combination_runs(trainer, obs, action):
    kwargs = json.dumps({"obs": obs, "action": action})
    result = trainer.run("--env=tests.space_envs:make_spaces_env", f"--env_kwargs={kwargs}",
                         f"--experiment={obs}_{action}", "--train_for_env_steps=3000", "--hidden_size=32", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    exp_dir = os.path.join(trainer.train_dir, f"{obs}_{action}")
    version, env_steps = parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))
    assert version >= 3 and env_steps >= 3000


@pytest.mark.timeout(60)
@pytest.mark.parametrize("action, batched", [("discrete_start", False), ("multi_discrete_start", False),
                                             ("grid_multi_discrete_start", False), ("grid_multi_discrete_start", True)])
def test_actions_numbered_from_a_start_reach_the_env_in_its_space(trainer, action, batched):
    """Discrete(3, start=-1) takes -1, 0 and 1: the model's choice i is the env's start + i; a MultiDiscrete of two
    axes gets its choices in its own shape. An action out of the space raises in the env's step, which the run counts
    as an env error."""
    kwargs = json.dumps({"obs": "vector", "action": action})
    experiment = f"{action}_{batched}"
    result = trainer.run("--env=tests.space_envs:make_spaces_env", f"--env_kwargs={kwargs}",
                         f"--experiment={experiment}", "--train_for_env_steps=3000", f"--batched_sampling={batched}",
                         *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(trainer.train_dir, experiment, "result.json")) as f:
        assert json.load(f)["faults"]["env_errors"] == 0


@pytest.mark.timeout(60)
def test_a_scalar_observation_trains_and_exports(trainer):
    """A Box of shape (): each step's observation is one number, a batch of them a vector."""
    kwargs = json.dumps({"obs": "scalar", "action": "discrete"})
    result = trainer.run("--env=tests.space_envs:make_spaces_env", f"--env_kwargs={kwargs}", "--experiment=scalar",
                         "--train_for_env_steps=3000", "--normalize_input=True", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    exp_dir = os.path.join(trainer.train_dir, "scalar")
    assert parse_name(latest_checkpoint(checkpoint_dir(exp_dir, 0)))[1] >= 3000
    policy = load_policy(exp_dir)
    assert onnx_difference(export_policy(policy, "onnx", os.path.join(exp_dir, "p.onnx")),
                           ExportedModel(policy.model, ["obs"]), policy, samples=20, seed=0) <= 1e-5


@pytest.mark.timeout(60)
def test_user_env_registered_by_name_trains(trainer):
    command = [sys.executable, "tests/user_launcher.py", f"--train_dir={trainer.train_dir}", "--env=my_corridor",
               "--experiment=by_name", "--train_for_env_steps=40000", *SMALL]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": REPO})
    assert result.returncode == 0, result.stdout + result.stderr
    assert final_reward(trainer.train_dir, "by_name") > 0.5  # random play: about -0.5; best: 0.86


@pytest.mark.timeout(60)
def test_user_env_given_as_module_function_trains(trainer):
    result = trainer.run("--env=tests.user_env:make_corridor", "--experiment=by_function",
                         "--train_for_env_steps=40000", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert final_reward(trainer.train_dir, "by_function") > 0.5


@pytest.mark.timeout(60)
def test_user_env_given_as_module_class_trains(trainer):
    """`--env=module:Class` calls the class with --env_kwargs, as a make function is called; before, it fell through to
    gymnasium.make, which said the env does not exist."""
    result = trainer.run("--env=tests.space_envs:SpacesEnv", '--env_kwargs={"action": "multi_discrete"}',
                         "--experiment=by_class", "--train_for_env_steps=2000", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(trainer.train_dir, "by_class", "result.json")) as f:
        assert json.load(f)["env_steps"] >= 2000


@pytest.mark.timeout(60)
@pytest.mark.parametrize("task", ["FrozenLake-v1", "MiniGrid-Empty-5x5-v0"])
def test_envpool_tasks_that_observe_a_discrete_state_train(trainer, task):
    """EnvPool's FrozenLake observes a Discrete state, its MiniGrid a Dict holding a Discrete direction: one-hot
    vectors, as through gymnasium, in the per-env env (spaces) and the batched pool the actors step; before, refused
    as an unsupported observation space."""
    pytest.importorskip("envpool")
    env = make_env(f"envpool:{task}")
    observation, _ = env.reset()
    assert env.observation_space.contains(observation), env.observation_space
    env.close()
    result = trainer.run(f"--env=envpool:{task}", "--experiment=envpool", "--train_for_env_steps=2000", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(trainer.train_dir, "envpool", "result.json")) as f:
        result = json.load(f)
    assert result["env_steps"] >= 2000 and result["faults"]["env_errors"] == 0, result


@pytest.mark.timeout(120)  # 11 s of training and 5 s of games on 2 cores
def test_blackjack_tuple_observations_learn_the_basic_strategy(trainer):
    """Blackjack observes a Tuple of Discretes (player sum, dealer card, usable ace), seen as one vector of one-hots.
    Random play averages -0.40 a game, the basic strategy about -0.05; 100k env steps reached -0.049 at seeds 0 and 1
    (20,000 games each)."""
    result = trainer.run("--env=Blackjack-v1", "--experiment=blackjack", "--train_for_env_steps=100000", "--seed=0",
                         "--num_workers=1", "--num_envs_per_worker=8", timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    policy = load_policy(os.path.join(trainer.train_dir, "blackjack"))
    env = make_env("Blackjack-v1")
    rewards = []
    for game in range(4000):
        observation, _ = env.reset(seed=game)
        ended = False
        while not ended:
            observation, reward, terminated, truncated, _ = env.step(int(policy.act(observation, deterministic=True)))
            ended = terminated or truncated
        rewards.append(reward)
    assert np.mean(rewards) > -0.12, np.mean(rewards)  # 4,000 games: a standard error of about 0.015


@pytest.mark.timeout(240)  # 30 s (one policy) and 70 s (two) on 2 cores; CI's machines are slower
@pytest.mark.parametrize("policies", [1, 2])
def test_multi_agent_env_is_learned(trainer, policies):
    # Each policy trains on its own agents' share of the env steps, so two policies get a larger budget.
    env_steps = {1: 250_000, 2: 400_000}[policies]
    result = trainer.run("--env=coop_multi_agent", f"--experiment=coop{policies}", f"--num_policies={policies}",
                         f"--train_for_env_steps={env_steps}", "--num_workers=2", "--num_envs_per_worker=8",
                         "--report_interval=1")
    assert result.returncode == 0, result.stdout + result.stderr
    # Random play scores about 6.3 per agent per episode, the best play 49.6.
    for policy in range(policies):
        assert final_reward(trainer.train_dir, f"coop{policies}", policy) > 25, result.stdout[-2000:]


@pytest.mark.timeout(60)
def test_unknown_encoder_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "appo.train", "--env=CartPole-v1", f"--train_dir={tmp_path}",
                             "--encoder=no_such_encoder"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--encoder=no_such_encoder" in lines[0]
    assert not os.listdir(tmp_path)
