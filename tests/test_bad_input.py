"""Bad input: one clear line naming the problem, exit code 2, and the experiment dir left untouched."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tests.conftest import REPO


def snapshot(directory: str) -> dict[str, bytes]:
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, directory)] = f.read()
    return files


@pytest.fixture
def existing_experiment(tmp_path):
    """An experiment dir as a previous run leaves it: cfg.json, a log, a checkpoint folder."""
    train_dir = tmp_path / "train_dir"
    exp = train_dir / "exp"
    (exp / "checkpoint_p0").mkdir(parents=True)
    subprocess.run([sys.executable, "-c", (
        "import sys; from appo.config.cfg import parse_args, save_cfg; "
        "cfg, _ = parse_args(['--env=CartPole-v1']); save_cfg(cfg, sys.argv[1])"), str(exp / "cfg.json")],
        cwd=REPO, check=True)
    (exp / "log.txt").write_text("earlier run\n")
    return str(train_dir), str(exp)


def run(train_dir: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appo.train", f"--train_dir={train_dir}", "--experiment=exp", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,expected", [
    (["--env=CartPole-v1", "--num_envs_per_worker=5", "--worker_num_splits=2"], "not divisible by --worker_num_splits"),
    (["--env=CartPole-v1", "--num_workers=0"], "--num_workers=0: must be a positive integer"),
    (["--env=CartPole-v1", "--device=cuda:abc"], "--device=cuda:abc: use cpu, cuda, cuda:N or auto"),
    (["--env=CartPole-v1", "--rollout=-4"], "--rollout=-4: must be a positive integer"),
    (["--env=CartPole-v1", "--num_workers=1", "--policy_workers_per_policy=2"], "more than --num_workers=1"),
    (["--env=CartPole-v1", "--no_such_flag=1"], "unrecognized arguments: --no_such_flag=1"),
    (["--env=CartPole-v1", "--use_rnn=maybe"], "--use_rnn"),
    (["--num_workers=2"], "--env"),
    (["--env=CartPole-v1", "--use_rnn=True"], "--use_rnn=True differs from the saved experiment"),
    (["--env=CartPole-v1", "--backend=spark"], "--backend: invalid choice: 'spark'"),
    (["--env=CartPole-v1", "--ray_workers_per_node=-1"], "--ray_workers_per_node=-1: must be 0 (split evenly) or more"),
    (["--env=CartPole-v1", "--backend=ray", "--ray_address=nonsense"], "--ray_address=nonsense: use host:port"),
    (["--env=CartPole-v1", "--backend=ray", "--ray_address=127.0.0.1:1"],
     "--ray_address=127.0.0.1:1: nothing answers there"),
])
def test_bad_flags(existing_experiment, args, expected):
    train_dir, exp = existing_experiment
    before = snapshot(exp)
    result = run(train_dir, *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert snapshot(exp) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env", ["NoSuchEnv-v9", "no_such_module:Env-v0", "tests.flaky_envs:NoSuchEnv-v0"])
def test_unknown_env_creates_nothing(tmp_path, env):
    result = subprocess.run([sys.executable, "-m", "appo.train", f"--train_dir={tmp_path}", "--experiment=new",
                             f"--env={env}"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--env={env}" in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "new")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,expected", [
    ("old_reset", "its reset returned an array of shape (3,), not gymnasium's (observation, info); an env of the old "
                  "gym API can be wrapped with shimmy's GymV26CompatibilityV0"),
    ("old_step", "its step returned a tuple of 4, not gymnasium's 5 (observation, reward, terminated, truncated, "
                 "info)"),
    ("shape", "its step returned an observation of shape (4,), where its observation_space says (3,)"),
    ("column", "its step returned an observation of shape (3, 1), where its observation_space says (3,)"),
    ("reward_array", "its step returned a reward of an array of shape (1,), not a number"),
    ("info_list", "its step returned info as a list, not a dict"),
    ("raising_reset", "its reset raised RuntimeError: Expected a numpy array with two dimensions."),
    ("raising_step", "its step raised KeyError: 'no such action'"),
])
def test_an_env_off_gymnasiums_api_is_one_line_at_launch_and_creates_nothing(tmp_path, kind, expected):
    """Checked on one reset and one step at launch (envs/contract.py); before, the workers crashed after start-up,
    an old gym step a hundred times over as env errors, a reset that raised (atari_pong's obs_type=ram) in a
    traceback."""
    result = run(str(tmp_path), "--env=tests.flaky_envs:make_off_api", f'--env_kwargs={{"kind": "{kind}"}}')
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --env=tests.flaky_envs:make_off_api: {expected}"), \
        result.stderr
    assert not os.path.exists(tmp_path / "exp")


def test_the_launch_check_reports_what_an_env_raises_but_not_its_time_limit():
    """A reset that raises is the check's answer; one that runs over the probe's time limit is left to the workers,
    even where the env's own code catches every Exception around the wait."""
    from appo.envs.contract import api_problem
    from appo.envs.registry import within
    from tests.flaky_envs import OffApiEnv

    class SlowEnv(OffApiEnv):
        def reset(self, *, seed=None, options=None):
            try:
                time.sleep(5)
            except Exception:
                return np.zeros(3, np.float32)  # off the API: returned only if the time limit were the env's error
            return super().reset(seed=seed, options=options)

    assert within(5, lambda: api_problem(OffApiEnv("raising_reset"), 0)) == \
        "its reset raised RuntimeError: Expected a numpy array with two dimensions."
    started = time.monotonic()
    assert within(0.2, lambda: api_problem(SlowEnv("fine"), 0)) is None
    assert time.monotonic() - started < 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env,kwargs,expected", [
    ("FrozenLake-v1", {"map_name": "9x9"},
     '--env=FrozenLake-v1 (--env_kwargs={"map_name": "9x9"}): making it raised KeyError: \'9x9\''),
    ("tests.flaky_envs:make_raising", {"error": "RuntimeError"}, '--env=tests.flaky_envs:make_raising '
     '(--env_kwargs={"error": "RuntimeError"}): making it raised RuntimeError: the simulator is not licensed'),
    ("tests.flaky_envs:make_raising", {"error": "TypeError"}, "making it raised TypeError: the simulator is not"),
    ("tests.flaky_envs:make_nothing", {}, "--env=tests.flaky_envs:make_nothing: its make function returned None, "
                                          "not an env (a gymnasium Env, or a PettingZoo ParallelEnv or AECEnv)"),
    ("tests.flaky_envs:no_such_function", {},
     "--env=tests.flaky_envs:no_such_function: module 'tests.flaky_envs' has no attribute 'no_such_function'"),
    ("tests.flaky_envs:np", {}, "'np' of module 'tests.flaky_envs' is a module, not a function or class"),
    (":make", {}, "--env=:make: no module before ':'; use 'package.module:function'"),
    ("raising_module:make", {}, "--env=raising_module:make: importing 'raising_module' raised ImportError: "
                                "this module needs a simulator"),
])
def test_an_env_whose_making_raises_is_one_line_and_creates_nothing(tmp_path, env, kwargs, expected):
    """What an env's module or make function raises at launch (or a make function that returns no env) is one line
    naming --env; before, a traceback of exit code 1 (or, for a name its module lacks, gymnasium's "doesn't exist")."""
    (tmp_path / "raising_module.py").write_text('raise ImportError("this module needs a simulator\\nmore")\n')
    result = subprocess.run([sys.executable, "-m", "appo.train", f"--train_dir={tmp_path}", "--experiment=new",
                             f"--env={env}", f"--env_kwargs={json.dumps(kwargs)}"], cwd=REPO, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --env=") and expected in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "new")


@pytest.mark.timeout(90)
def test_an_env_the_workers_read_as_they_always_did_passes_the_launch_check(tmp_path):
    """Observations of shape [1, 3] for a space of (3,) and a one-element terminated flag store and read as the space's
    (numpy assignment, `if`): such envs trained before the launch check and still do."""
    result = run(str(tmp_path), "--env=tests.flaky_envs:make_off_api", '--env_kwargs={"kind": "leading_axis"}',
                 "--num_workers=1", "--num_envs_per_worker=2", "--train_for_env_steps=2000")
    assert result.returncode == 0, result.stderr[-2000:]
    result = json.loads((tmp_path / "exp" / "result.json").read_text())
    assert result["env_steps"] >= 2000 and result["stats"]["0"]["length"] == 10, result


@pytest.mark.timeout(60)
def test_a_retired_gymnasium_id_is_one_error_line_and_creates_nothing(tmp_path):
    """Reacher-v2 is registered but its make raises ImportError (mujoco-py moved to gymnasium-robotics)."""
    result = subprocess.run([sys.executable, "-m", "appo.train", f"--train_dir={tmp_path}", "--experiment=new",
                             "--env=Reacher-v2"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [line for line in result.stderr.splitlines() if "Reacher-v2: cannot" in line], result.stderr
    assert errors[0].startswith("error: --env=Reacher-v2: cannot be made (") and "gymnasium-robotics" in errors[0]
    assert not os.path.exists(tmp_path / "new")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env,flag,expected", [
    ("CartPole-v1", '--env_kwargs={"nope": 1}', "--env_kwargs names 'nope', which its make function does not take"),
    ("tests.space_envs:make_spaces_env", '--env_kwargs={"obz": "vector"}', "--env_kwargs names 'obz'"),
    ("tests.space_envs:make_spaces_env_of", '--env_kwargs={"obs": "vector"}',
     "its make function needs an argument --env_kwargs"),
    ("CartPole-v1", "--encoder=nature_cnn", "--encoder=nature_cnn: the observation 'obs' of shape (4,) is no image"),
    ("catch", "--encoder=nature_cnn", "--encoder=nature_cnn: the observation 'obs' of shape (10, 5, 1) is under 36"),
    ("CartPole-v1", "--encoder=small_cnn", "--encoder=small_cnn: the observation 'obs' of shape (4,) is no image"),
    ("tests.space_envs:make_spaces_env", '--env_kwargs={"action": "dict_of_grid"}', "unsupported action space "
     "Dict('move': Box(0.0, [[1. 1.] [1. 2.]], (2, 2), float32)); use Discrete, MultiDiscrete, "
     "MultiBinary, Box or a Tuple of them"),
])
def test_flags_that_do_not_fit_the_env_are_one_line_and_create_nothing(tmp_path, env, flag, expected):
    """--env_kwargs its make function does not take; a CNN named for observations it cannot encode; an action space
    the models cannot take, in one line though its repr spans two."""
    result = run(str(tmp_path), f"--env={env}", flag)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--env={env}: {expected}" in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "exp")


@pytest.mark.timeout(60)
def test_random_openings_for_an_env_without_turns_is_one_line_and_creates_nothing(tmp_path):
    result = run(str(tmp_path), "--env=CartPole-v1", "--random_opening_moves=2")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--random_opening_moves=2: only a turn-based game" in lines[0], result.stderr
    assert "--env=CartPole-v1 is not one" in lines[0] and not os.path.exists(tmp_path / "exp")


@pytest.mark.timeout(60)
def test_an_observation_space_the_models_cannot_take_is_one_line_and_creates_nothing(tmp_path):
    """Strings have no fixed-size vector form (Blackjack's Tuple of Discretes has one: tests/test_registry.py)."""
    result = subprocess.run([sys.executable, "-m", "appo.train", f"--train_dir={tmp_path}", "--experiment=new",
                             "--env=tests.space_envs:make_spaces_env", '--env_kwargs={"obs": "text"}'],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--env=tests.space_envs:make_spaces_env: unsupported observation space Text" in lines[0]
    assert "use Box, Discrete, MultiDiscrete, MultiBinary, or a Tuple or Dict of them" in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "new")


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,expected", [
    (["--with_pbt=True"], "--with_pbt=True needs a population: --num_policies=1"),
    (["--num_policies=3", "--with_pbt=True", "--pbt_replace_fraction=0.7"], "--pbt_replace_fraction=0.7: must be"),
    (["--num_policies=3", "--with_pbt=True", "--pbt_mutation_rate=2"], "--pbt_mutation_rate=2.0: must be within"),
    (["--num_policies=3", "--with_pbt=True", "--pbt_perturb_min=0.5"], "need 1 <= min <= max"),
    (["--num_policies=8", "--agent_policy_mapping=split"], "--agent_policy_mapping=split needs a split per policy"),
])
def test_bad_pbt_flags_create_nothing(tmp_path, args, expected):
    result = subprocess.run([sys.executable, "-m", "appo.train", f"--train_dir={tmp_path}", "--experiment=new",
                             "--env=CartPole-v1", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "new")


@pytest.mark.timeout(60)
def test_train_dir_that_is_a_file_or_read_only(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    for train_dir, expected in [(str(a_file), "exists and is not a folder"),
                                ("/proc/appo_train_dir", "/proc is not a writable folder")]:
        result = subprocess.run([sys.executable, "-m", "appo.train", f"--train_dir={train_dir}", "--experiment=new",
                                 "--env=CartPole-v1"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"--train_dir={train_dir}" in lines[0] and expected in lines[0], result.stderr
    assert a_file.read_text() == "not a folder"


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_unavailable_device_creates_nothing(tmp_path, device):
    result = subprocess.run([sys.executable, "-m", "appo.train", f"--train_dir={tmp_path}", "--experiment=new",
                             "--env=CartPole-v1", f"--device={device}"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--device={device}: this machine has 0 CUDA device(s)" in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "new")


@pytest.mark.timeout(60)
def test_corrupt_pbt_population(tmp_path):
    exp = tmp_path / "exp"
    (exp / "pbt").mkdir(parents=True)
    subprocess.run([sys.executable, "-c", (
        "import sys; from appo.config.cfg import parse_args, save_cfg; "
        "cfg, _ = parse_args(['--env=CartPole-v1', '--num_policies=2', '--with_pbt=True']); "
        "save_cfg(cfg, sys.argv[1])"),
        str(exp / "cfg.json")], cwd=REPO, check=True)
    (exp / "pbt" / "population.json").write_text('{"policies": [{"hyperparams"')
    before = snapshot(str(exp))
    result = run(str(tmp_path), "--env=CartPole-v1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "population.json: corrupt PBT population file" in lines[0], result.stderr
    assert snapshot(str(exp)) == before


@pytest.mark.timeout(60)
def test_corrupt_cfg_json(existing_experiment):
    train_dir, exp = existing_experiment
    with open(os.path.join(exp, "cfg.json"), "w") as f:
        f.write('{"env": "CartPole-v1", "num_wor')
    before = snapshot(exp)
    result = run(train_dir, "--env=CartPole-v1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cfg.json" in lines[0] and "corrupt" in lines[0]
    assert snapshot(exp) == before


@pytest.mark.timeout(60)
def test_corrupt_checkpoint_is_not_bad_input_but_stays_in_place_when_the_input_is(existing_experiment):
    """A corrupt checkpoint no longer stops a run (it is moved aside and an older one used, see
    tests/test_checkpoint.py), but only once the input is valid: a bad flag still leaves every file as it was."""
    train_dir, exp = existing_experiment
    with open(os.path.join(exp, "checkpoint_p0", "checkpoint_000000005_1000.pth"), "wb") as f:
        f.write(b"PK\x03\x04 this is not a complete archive")
    before = snapshot(exp)
    result = run(train_dir, "--env=CartPole-v1", "--device=cuda:99")  # the last thing prepare checks
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device=cuda:99: this machine has" in lines[0], result.stderr
    assert snapshot(exp) == before
    with open(os.path.join(exp, "cfg.json")) as f:
        assert json.load(f)["env"] == "CartPole-v1"


def help_entries(text: str) -> dict[str, str]:
    """--help's text per flag: from the line that names it (`  --flag FLAG, --alias FLAG`, or from Python 3.13
    `  --flag, --alias FLAG`) to the next flag's."""
    entries: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        if line.startswith("  --"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = ""
        elif not line.startswith("  ") or line.startswith("  -h"):
            flag = None
        if flag is not None:
            entries[flag] += line + "\n"
    return entries


@pytest.mark.timeout(60)
def test_help_explains_every_flag():
    """Every flag of the table has one entry in --help, and the entry holds the flag's own help text (not only
    its name, which argparse prints anyway). That text is a sentence that says what the flag does, and leaves
    measurements to docs/PERFORMANCE.md."""
    from appo.config.flags import COMMAND_LINE_ONLY, FLAG_NAMES, spec

    result = subprocess.run([sys.executable, "-m", "appo.train", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    entries = help_entries(result.stdout)
    names = [*FLAG_NAMES, *COMMAND_LINE_ONLY]
    assert sorted(entries) == sorted(f"--{name}" for name in names)
    for name in names:
        text = spec(name).help
        assert text[0].isupper() and text.endswith(".") and len(text.split()) >= 4, (name, text)
        assert not re.search(r"\d%|\d frames/s", text), (name, text)  # a measurement
        assert "".join(text.split()) in "".join(entries[f"--{name}"].split()), name
    for flag in ("--num_workers", "--worker_num_splits", "--with_vtrace", "--max_policy_lag",
                 "--num_minibatches_to_accumulate", "--save_every_sec", "--device", "--with_pbt",
                 "--pbt_period_env_steps", "--pbt_replace_reward_gap", "--pbt_target_objective"):
        assert flag in result.stdout and flag in entries


def test_sample_factory_flag_names_are_accepted_and_count_as_given():
    from appo.config.cfg import ConfigError, parse_args

    cfg, given = parse_args(["--env=CartPole-v1", "--num_epochs", "4", "--num_batches_per_epoch=8", "--rnn_size=32",
                             "--restart_behavior=overwrite", "--device=gpu"])
    assert (cfg.ppo_epochs, cfg.num_batches_per_iteration, cfg.hidden_size) == (4, 8, 32)
    assert cfg.restart is True and cfg.device == "cuda"
    assert {"ppo_epochs", "num_batches_per_iteration", "hidden_size", "restart"} <= given  # they override a resume
    assert parse_args(["--env=CartPole-v1", "--restart_behavior=resume"])[0].restart is False
    with pytest.raises(ConfigError, match=r"--restart_behavior: invalid choice: 'delete'"):
        parse_args(["--env=CartPole-v1", "--restart_behavior=delete"])
    with pytest.raises(ConfigError, match="num_epoch"):  # a prefix is an error, not a guess
        parse_args(["--env=CartPole-v1", "--num_epoch=4"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script,args,expected", [
    ("bench_sampler.py", ["--env=NoSuchEnv-v9"], "error: --env=NoSuchEnv-v9: cannot be made"),
    ("bench_sampler.py", ["--seconds=-1"], "error: --seconds=-1 must be more than 0"),
    ("bench_sampler.py", ["--", "--bogus=1"], "error: unrecognized arguments: --bogus=1"),
    ("time_to_solve.py", ["--runs", "0"], "error: --runs=0 must be 1 or more"),
    ("time_to_solve.py", ["--runs", "2", "--", "--env=NoSuchEnv-v9"], "error: --env=NoSuchEnv-v9: cannot be made"),
    ("benchmark.py", ["--report", "--results=no_such_results", "--out=no_such_out"],
     "error: --results=no_such_results: no such folder of finished cells"),
])
def test_the_measuring_scripts_refuse_bad_input_in_one_line_before_measuring(script, args, expected):
    """The raw limit's processes or the trainer's runs do not start: bench_sampler's raw limit failed in a traceback,
    time_to_solve took a trainer refused for its flags for a run that did not solve, each run."""
    result = subprocess.run([sys.executable, f"scripts/{script}", *args], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert expected in result.stderr.strip().splitlines()[-1] and result.stdout == "", (result.stdout, result.stderr)
