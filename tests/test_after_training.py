"""After training: load_policy, enjoy (with video), ONNX and TorchScript export, the Python API."""

import glob
import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
import warnings

import numpy as np
import onnxruntime
import pytest
import torch

from appo import launch, load_policy, train
from appo.config.cfg import ConfigError, parse_args, parse_keywords, resolve, save_cfg
from appo.envs import env_info
from appo.hooks import Hooks
from appo.learning.checkpoint import checkpoint_dir, save_checkpoint
from appo.learning.policy import Policy
from appo.learning.trained_policy import Episode, PolicyLoadError, summarise
from appo.spaces import obs_spaces
from appo.tools.enjoy import image_from_obs
from appo.tools.export import ExportedModel, example_inputs, export_policy, onnx_difference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACES_ENV = "tests.space_envs:make_spaces_env"


def make_experiment(train_dir, name: str, *flags: str, version: int = 3) -> str:
    """An experiment dir as training leaves it (cfg.json and a checkpoint), with untrained random weights."""
    cfg, _ = parse_args([f"--train_dir={train_dir}", f"--experiment={name}", *flags])
    info = env_info(cfg.env, json.loads(cfg.env_kwargs))
    cfg = resolve(cfg, info.num_agents)
    exp_dir = os.path.join(str(train_dir), name)
    os.makedirs(exp_dir)
    save_cfg(cfg, os.path.join(exp_dir, "cfg.json"))
    torch.manual_seed(0)
    policy = Policy(0, cfg, (info.obs_space, info.action_space), torch.device("cpu"))
    save_checkpoint(checkpoint_dir(exp_dir, 0), policy.state_dict(), version, 1000 * version, keep=2)
    return exp_dir


def run_module(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------- load_policy
def test_load_policy_acts_single_and_batched(tmp_path):
    exp_dir = make_experiment(tmp_path, "cartpole", "--env=CartPole-v1")
    policy = load_policy(exp_dir)
    assert (policy.version, policy.env_steps) == (3, 3000)
    obs = np.zeros((5, 4), dtype=np.float32)
    actions = policy.act(obs, deterministic=True)
    assert len(actions) == 5 and all(a in (0, 1) for a in actions)
    assert policy.act(obs[0], deterministic=True) == actions[0]  # one observation, one action
    same_file = load_policy(policy.checkpoint)
    assert same_file.act(obs, deterministic=True) == actions


def test_deterministic_is_the_most_likely_action(tmp_path):
    exp_dir = make_experiment(tmp_path, "cartpole", "--env=CartPole-v1")
    policy = load_policy(exp_dir)
    obs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    params, _, _ = policy.model.forward_step({"obs": torch.from_numpy(obs)}, torch.zeros(64, 0))
    assert policy.act(obs, deterministic=True) == params.argmax(-1).tolist()


@pytest.mark.parametrize("flags", [["--use_rnn=True"], ["--use_rnn=True", "--rnn_type=lstm",
                                                      "--actor_critic_share_weights=False"]])
def test_recurrent_state_is_carried_until_reset(tmp_path, flags):
    exp_dir = make_experiment(tmp_path, "rnn", "--env=CartPole-v1", *flags)
    policy = load_policy(exp_dir)
    obs = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    policy.act(obs)
    carried = policy.rnn_states.clone()
    assert carried.abs().sum() > 0
    policy.act(obs)
    assert not torch.equal(policy.rnn_states, carried)  # the state moved on from the carried one
    policy.reset(rows=[1])
    assert policy.rnn_states[1].abs().sum() == 0 and policy.rnn_states[0].abs().sum() > 0
    policy.reset()
    assert policy.rnn_states is None


def test_act_names_an_observation_of_the_wrong_shape_or_keys(tmp_path):
    """A CartPole policy takes (4,) or [batch, 4]: other shapes were torch's errors from inside the model."""
    policy = load_policy(make_experiment(tmp_path, "cartpole", "--env=CartPole-v1"))
    assert isinstance(policy.act(np.zeros(4, np.float32)), int) and len(policy.act(np.zeros((3, 4), np.float32))) == 3
    for wrong in (np.zeros((4, 5)), np.zeros((2, 2, 4)), np.float32(1), np.zeros((0, 4))):
        with pytest.raises(ValueError, match=rf"^act: the observation of shape {re.escape(str(np.shape(wrong)))}, "
                                             r"where the policy takes \(4,\) \(one\) or \[batch, \*\(4,\)\]"):
            policy.act(wrong)
    with pytest.raises(ValueError, match=r"^act: an observation of keys \['state'\], where the policy takes \['obs'\]"):
        policy.act({"state": np.zeros(4)})


def test_load_policy_errors_name_the_path(tmp_path):
    with pytest.raises(PolicyLoadError, match="no such experiment"):
        load_policy(str(tmp_path / "missing"))
    exp_dir = make_experiment(tmp_path, "cartpole", "--env=CartPole-v1")
    with pytest.raises(PolicyLoadError, match=r"no policy 1: the run trained policy 0 \(--policy\)"):
        load_policy(exp_dir, policy_id=1)
    with pytest.raises(PolicyLoadError, match=r"no policy -1: the run trained policy 0"):
        load_policy(exp_dir, policy_id=-1)
    # A policy's checkpoint folder stands for that policy of its experiment (appo.versus takes no --policy).
    assert load_policy(os.path.join(exp_dir, "checkpoint_p0")).checkpoint == load_policy(exp_dir).checkpoint
    with pytest.raises(PolicyLoadError, match="no best checkpoint: the run evaluated none"):
        load_policy(os.path.join(exp_dir, "checkpoint_p0", "best.pth"))
    for checkpoint in glob.glob(os.path.join(exp_dir, "checkpoint_p0", "*.pth")):
        os.remove(checkpoint)
    with pytest.raises(PolicyLoadError, match="no checkpoint of policy 0"):
        load_policy(exp_dir)
    bad = tmp_path / "model.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(PolicyLoadError, match="not a checkpoint"):
        load_policy(str(bad))


# ---------------------------------------------------------------- enjoy
def test_enjoy_plays_and_writes_a_video(tmp_path):
    import imageio_ffmpeg

    make_experiment(tmp_path, "cartpole", "--env=CartPole-v1")
    video_dir = tmp_path / "videos"
    out = run_module("appo.enjoy", f"--train_dir={tmp_path}", "--experiment=cartpole", "--episodes=2",
                     "--deterministic", "--save_video", f"--video_dir={video_dir}")
    assert out.returncode == 0, out.stderr
    summary = next(line for line in out.stdout.splitlines() if line.startswith("2 episodes: return"))
    mean_length = float(summary.split("length ")[1].split(" ")[0])
    frames = imageio_ffmpeg.read_frames(str(video_dir / "policy0_v3.mp4"))
    meta = next(frames)
    assert meta["size"] == (600, 400)  # CartPole's rgb_array frames, width x height
    assert sum(1 for _ in frames) == round(2 * mean_length)  # one frame per step played


def test_summarise_leaves_non_finite_returns_out_of_the_mean_and_counts_them():
    episodes = [Episode(1.0, 10), Episode(float("nan"), 20), Episode(3.0, 30), Episode(float("inf"), 40)]
    results = summarise(episodes)
    assert (results["reward"], results["reward_std"], results["reward_nonfinite"]) == (2.0, 1.0, 2.0)
    assert (results["length"], results["episodes"]) == (25.0, 4.0)
    assert "reward_nonfinite" not in summarise(episodes[:1])
    only_nan = summarise([Episode(float("nan"), 5)])
    assert math.isnan(only_nan["reward"]) and only_nan["reward_nonfinite"] == 1.0


def test_enjoy_reports_nan_and_inf_returns(tmp_path):
    """Episodes 2 and 4 of this env get a NaN and an inf reward: enjoy prints them and sums up the others."""
    make_experiment(tmp_path, "nan", "--env=tests.flaky_envs:NonFiniteReturnCartPole-v0")
    out = run_module("appo.enjoy", f"--train_dir={tmp_path}", "--experiment=nan", "--episodes=4", "--deterministic")
    assert out.returncode == 0, out.stderr
    logged = out.stdout + out.stderr
    assert "Episode 2: return nan" in logged and "Episode 4: return inf" in logged
    assert "4 episodes: return " in out.stdout and "(2 with a NaN or infinite return left out)" in out.stdout


def test_enjoy_save_video_without_opengl_is_one_line(tmp_path):
    """A MuJoCo env whose OpenGL backend cannot start (GLFW without a display) stops at the first frame with one line
    that names --save_video and the MUJOCO_GL to use."""
    pytest.importorskip("mujoco")
    make_experiment(tmp_path, "pendulum", "--env=InvertedPendulum-v5")
    env = {key: value for key, value in os.environ.items() if key not in ("DISPLAY", "WAYLAND_DISPLAY")}
    out = subprocess.run([sys.executable, "-m", "appo.enjoy", f"--train_dir={tmp_path}", "--experiment=pendulum",
                          "--episodes=1", "--save_video"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**env, "MUJOCO_GL": "glfw"})  # cwd: MuJoCo writes MUJOCO_LOG.TXT there
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--save_video" in out.stderr and "MUJOCO_GL=egl" in out.stderr


@pytest.mark.slow
def test_enjoy_multi_agent_and_bad_input(tmp_path):
    make_experiment(tmp_path, "coop", "--env=coop_multi_agent")
    out = run_module("appo.enjoy", f"--train_dir={tmp_path}", "--experiment=coop", "--episodes=3")
    assert out.returncode == 0, out.stderr
    assert "3 episodes: return" in out.stdout
    out = run_module("appo.enjoy", f"--train_dir={tmp_path}", "--experiment=coop", "--save_video")
    assert out.returncode == 2 and "--save_video" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = run_module("appo.enjoy", f"--train_dir={tmp_path}", "--experiment=missing")
    assert out.returncode == 2 and "no such experiment" in out.stderr
    out = run_module("appo.enjoy", f"--train_dir={tmp_path}")
    assert out.returncode == 2 and "--experiment (or --checkpoint=PATH) is required" in out.stderr
    out = run_module("appo.enjoy", f"--train_dir={tmp_path}", "--experiment=coop", "--episode=3")
    assert out.returncode == 2 and "--episode" in out.stderr  # no abbreviations
    out = run_module("appo.enjoy", f"--train_dir={tmp_path}", "--experiment=coop", "--fps=0")
    assert out.returncode == 2 and "--fps=0: must be more than 0" in out.stderr


def test_video_frame_from_image_observations():
    stacked = np.arange(4 * 84 * 84, dtype=np.uint8).reshape(4, 84, 84)
    frame = image_from_obs(stacked)
    assert frame.shape == (84, 84, 3) and (frame[..., 0] == stacked[-1]).all()
    rgb = np.zeros((36, 36, 3), dtype=np.uint8)
    assert image_from_obs(rgb) is rgb
    planes = np.arange(10 * 10 * 7, dtype=np.uint8).reshape(10, 10, 7)  # MinAtar's Freeway: 7 planes last
    frame = image_from_obs({"obs": planes})
    assert frame.shape == (10, 10, 3) and (frame[..., 1] == planes[..., -1]).all()


# ---------------------------------------------------------------- export
@pytest.mark.parametrize("name,flags", [
    ("mlp", ["--env=CartPole-v1", "--normalize_input=True"]),
    ("cnn", [f"--env={SPACES_ENV}", '--env_kwargs={"obs": "image"}']),
    ("gru", ["--env=CartPole-v1", "--use_rnn=True"]),
    # separate actor and critic cores: the state holds both (h and c of each LSTM)
    ("lstm_separate", ["--env=CartPole-v1", "--use_rnn=True", "--rnn_type=lstm", "--actor_critic_share_weights=False"]),
    ("dict_box", [f"--env={SPACES_ENV}", '--env_kwargs={"obs": "dict", "action": "box"}']),
    ("offset_box", [f"--env={SPACES_ENV}", '--env_kwargs={"action": "offset_box"}']),
])
def test_onnx_matches_torch(tmp_path, name, flags):
    exp_dir = make_experiment(tmp_path, name, *flags)
    policy = load_policy(exp_dir)
    path = export_policy(policy, "onnx", str(tmp_path / f"{name}.onnx"))
    module = ExportedModel(policy.model, list(obs_spaces(policy.obs_space)))
    assert onnx_difference(path, module, policy, samples=100, seed=1) <= 1e-5
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    recurrent = "--use_rnn=True" in flags
    assert outputs[:2] == ["action_params", "values"] and (outputs[2:] == ["next_rnn_states"]) == recurrent


def test_torchscript_matches_torch(tmp_path):
    """Without a TracerWarning (the trace holds for every batch size), at a batch under and one over the size where
    eager inference takes the fast tanh."""
    exp_dir = make_experiment(tmp_path, "gru", "--env=CartPole-v1", "--use_rnn=True")
    policy = load_policy(exp_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        path = export_policy(policy, "torchscript", str(tmp_path / "gru.pt"))
    loaded = torch.jit.load(path)
    module = ExportedModel(policy.model, ["obs"])
    for rows in (7, 100):
        inputs = [torch.from_numpy(x) for x in example_inputs(policy, rows, np.random.default_rng(2))]
        with torch.no_grad():
            for ours, theirs in zip(loaded(*inputs), module(*inputs)):
                assert torch.allclose(ours, theirs, atol=1e-6)


def test_an_untrained_policy_acts_at_the_box_centre_in_torch_and_in_exports(tmp_path):
    """The Gaussian's mean starts at the centre of each dimension of [0.9, 1] x [0, 1] x [-1, 3] (the policy head's
    output is near 0 at first), in the trainer's deterministic action and in the ONNX and TorchScript files."""
    exp_dir = make_experiment(tmp_path, "box", f"--env={SPACES_ENV}", '--env_kwargs={"action": "offset_box"}')
    policy = load_policy(exp_dir)
    obs = np.random.default_rng(0).standard_normal((16, 5)).astype(np.float32)
    centre = np.array([0.95, 0.5, 1.0], np.float32)
    assert np.allclose(policy.act(obs, deterministic=True), centre, atol=0.1)  # the old mean was 0
    onnx_path = export_policy(policy, "onnx", str(tmp_path / "box.onnx"))
    session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    means = session.run(None, {"obs": obs})[0][:, :3]
    assert np.allclose(means, centre, atol=0.1)
    traced = torch.jit.load(export_policy(policy, "torchscript", str(tmp_path / "box.pt")))
    assert np.allclose(traced(torch.from_numpy(obs))[0][:, :3].detach().numpy(), means, atol=1e-6)


def test_export_command(tmp_path):
    make_experiment(tmp_path, "cartpole", "--env=CartPole-v1")
    out = run_module("appo.export", f"--train_dir={tmp_path}", "--experiment=cartpole", "--format=onnx")
    assert out.returncode == 0, out.stderr
    assert os.path.exists(tmp_path / "cartpole" / "export" / "policy0.onnx")
    out = run_module("appo.export", f"--train_dir={tmp_path}", "--experiment=cartpole", "--format=tflite")
    assert out.returncode == 2 and "--format" in out.stderr


# ---------------------------------------------------------------- Python API
@pytest.mark.slow
def test_package_exports_the_functions_without_loading_torch():
    code = ("import sys; from appo import train; import appo, appo.launch; "
            "assert train is appo.train is appo.launch.train; "
            "assert 'torch' not in sys.modules; "  # the runner forks workers from here: it must stay torch-free
            "from appo import load_policy; assert callable(load_policy)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_keywords_give_the_config_of_the_same_flags():
    keywords = parse_keywords({"env": "CartPole-v1", "use_rnn": True, "learning_rate": 1e-3, "gamma": 1,
                               "rnn_size": 64, "env_kwargs": {"max_episode_steps": 100}, "seed": None})
    flags = parse_args(["--env=CartPole-v1", "--use_rnn=True", "--learning_rate=0.001", "--gamma=1", "--rnn_size=64",
                        '--env_kwargs={"max_episode_steps": 100}'])
    assert keywords == (flags[0], flags[1] | {"seed"})
    cfg = keywords[0]
    assert cfg.use_rnn is True and cfg.learning_rate == 1e-3 and cfg.hidden_size == 64
    assert type(cfg.gamma) is float and json.loads(cfg.env_kwargs) == {"max_episode_steps": 100}


@pytest.mark.parametrize("keywords, argv", [({"num_workers": 0}, ["--num_workers=0"]),
                                            ({"num_worker": 2}, ["--num_worker=2"]),  # no abbreviations
                                            ({"batch_size": 100}, ["--batch_size=100"]),
                                            ({"device": "tpu"}, ["--device=tpu"])])
def test_a_bad_keyword_gets_the_error_line_of_the_flag(tmp_path, capsys, keywords, argv):
    common = {"experiment": "bad", "train_dir": str(tmp_path)}
    with pytest.raises(ConfigError) as error:
        train(env="CartPole-v1", **common, **keywords)
    assert launch.main(["--env=CartPole-v1", *[f"--{name}={value}" for name, value in common.items()], *argv]) == 2
    assert capsys.readouterr().err == f"error: {error.value}\n"
    assert not os.path.exists(tmp_path / "bad")


@pytest.mark.slow
def test_train_raises_on_bad_flags_and_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match="num_workers"):
        train(env="CartPole-v1", experiment="bad", train_dir=str(tmp_path), num_workers=0)
    with pytest.raises(ConfigError):
        train(env="CartPole-v1", experiment="bad", train_dir=str(tmp_path), num_worker=2)  # no abbreviations
    assert not os.path.exists(tmp_path / "bad")


@pytest.mark.parametrize("hooks, expected", [
    ([print], "hooks: a list, not appo.hooks.Hooks"),
    (Hooks(on_checkpoint=print), r"hooks: Hooks\(on_checkpoint=...\) must be a list of functions"),
    (Hooks(on_evaluation=[5]), r"hooks: Hooks\(on_evaluation=\[...\]\) holds 5, which is not callable"),
])
def test_hooks_that_cannot_be_called_are_refused_before_anything_is_written(tmp_path, hooks, expected):
    """They were an AttributeError or TypeError from inside the run, or a traceback per call and a completed run."""
    with pytest.raises(ConfigError, match=expected):
        train(env="CartPole-v1", experiment="hooked", train_dir=str(tmp_path), hooks=hooks)
    assert not os.path.exists(tmp_path / "hooked")


def test_train_outside_the_main_thread_is_refused_before_anything_is_written(tmp_path):
    """Its signal handlers need the main thread: signal.signal raised ValueError after cfg.json and log.txt were
    written."""
    raised = []

    def call() -> None:
        try:
            train(env="CartPole-v1", experiment="threaded", train_dir=str(tmp_path))
        except ConfigError as exc:
            raised.append(str(exc))

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(timeout=30)
    assert raised and raised[0].startswith("train() runs the trainer in its process's main thread")
    assert not os.path.exists(tmp_path / "threaded")


@pytest.mark.timeout(90)
def test_train_in_process_leaves_the_interpreters_hooks_and_the_logger_as_they_were(tmp_path):
    """A run in the caller's process, summaries written included, leaves the process-wide exception hooks alone, and
    the 'appo' logger as it found it (its handlers, propagation and level), so the caller's logging goes on as before:
    also after a run that was finished already, and after bad flags."""
    hooks = threading.excepthook, sys.unraisablehook
    logger = logging.getLogger("appo")
    ours, level = logging.NullHandler(), logger.level
    logger.addHandler(ours)
    try:
        logger.setLevel(logging.WARNING)
        state = logger.handlers[:], logger.propagate, logger.level
        common = {"experiment": "hooks", "train_dir": str(tmp_path), "num_workers": 1}
        result = train(env="CartPole-v1", **common, num_envs_per_worker=4, train_for_env_steps=4000,
                       experiment_summaries_interval=0.2)
        assert result.completed and os.listdir(tmp_path / "hooks" / "summaries" / "0")
        assert (threading.excepthook, sys.unraisablehook) == hooks
        assert (logger.handlers, logger.propagate, logger.level) == state
        assert train(env="CartPole-v1", **common).reason == "already finished"
        with pytest.raises(ConfigError):
            train(env="CartPole-v1", **common, batch_size=100)
        assert (logger.handlers, logger.propagate, logger.level) == state
    finally:
        logger.removeHandler(ours)
        logger.setLevel(level)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_api_script_trains_then_plays_in_one_process(tmp_path):
    """scripts/api_cartpole.py: train() to a mean of 475, load_policy(), 20 deterministic episodes."""
    out = subprocess.run([sys.executable, "scripts/api_cartpole.py", f"--train_dir={tmp_path}"], cwd=REPO,
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["completed"] and result["env_steps"] > 0 and os.path.exists(result["checkpoint"])
    assert result["mean_return"] >= 475, result


# ---------------------------------------------------------------- plot
def write_run(train_dir, name: str, rewards: list[float]) -> str:
    from tensorboardX import SummaryWriter

    run_dir = os.path.join(str(train_dir), name)
    with SummaryWriter(os.path.join(run_dir, "summaries", "0")) as writer:
        for i, reward in enumerate(rewards):
            writer.add_scalar("episode/reward", reward, 1000 * (i + 1))
    return run_dir


def test_plot_groups_seeds_into_mean_and_range(tmp_path):
    from appo.tools.plot import group_runs, mean_and_range, read_curve

    runs = [write_run(tmp_path, f"cartpole_{seed}", [10.0 * seed + i for i in range(5 + seed)]) for seed in range(3)]
    other = write_run(tmp_path, "pendulum", [-1000.0, -500.0])
    assert group_runs([*runs, other]) == {"cartpole": runs, "pendulum": [other]}
    grid, mean, low, high = mean_and_range([read_curve(run, "episode/reward", 0, "env_steps") for run in runs])
    assert grid[0] == 1000 and grid[-1] == 5000  # up to where the shortest run ends
    assert mean[0] == pytest.approx(10.0) and low[0] == 0.0 and high[0] == 20.0
    import matplotlib.pyplot as plt

    from appo.tools.plot import draw_mean

    single = write_run(tmp_path, "short", [5.0])  # one point: a line of one point draws nothing without its marker
    figure, ax = plt.subplots()
    draw_mean(ax, [read_curve(single, "episode/reward", 0, "env_steps")], "short")
    assert ax.lines[0].get_marker() == "o"
    plt.close(figure)

    out = run_module("appo.plot", *runs, other, f"--out={tmp_path / 'curves.png'}", "--x=seconds")
    assert out.returncode == 0, out.stderr
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "curves.png").shape[:2] == (500, 800)
    out = run_module("appo.plot", str(tmp_path / "missing"), f"--out={tmp_path / 'x.png'}")
    assert out.returncode == 2 and "no tensorboard summaries" in out.stderr
    out = run_module("appo.plot", *runs, "--tag=episode/objective", f"--out={tmp_path / 'x.png'}")
    assert out.returncode == 2 and "episode/reward" in out.stderr  # names the scalars it has
    (tmp_path / "a_file").write_text("")
    for bad in (tmp_path / "a_file" / "x.png", tmp_path / "curves.txt"):  # a dir that is a file; no such format
        out = run_module("appo.plot", *runs, f"--out={bad}")
        assert out.returncode == 2 and f"--out={bad}: cannot be written" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and not os.path.exists(bad)


# ---------------------------------------------------------------- custom metrics and the summary line
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_custom_episode_metrics_reach_tensorboard_and_the_summary(trainer):
    from appo.tools.plot import read_curve

    out = trainer.run("--env=mountain_car_shaped", "--experiment=metrics", "--num_workers=1",
                      "--num_envs_per_worker=8", "--train_for_env_steps=60000", "--experiment_summaries_interval=1",
                      timeout=80)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    run_dir = os.path.join(trainer.train_dir, "metrics")
    _, progress = read_curve(run_dir, "episode_extra/progress", 0, "env_steps")
    _, goal = read_curve(run_dir, "episode_extra/true_objective", 0, "env_steps")
    assert len(progress) > 0 and ((progress > 0) & (progress <= 1)).all() and ((goal >= 0) & (goal <= 1)).all()
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "Summary:" in line)
    assert lines[at].endswith(" env steps") and "p0: final reward " in lines[at + 1] and " (best " in lines[at + 1]
    assert "p0 checkpoint: " in lines[at + 2] and "checkpoint_p0/checkpoint_" in lines[at + 2]


# ---------------------------------------------------------------- evaluation during training and user hooks
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_evaluation_best_checkpoint_and_launcher_hooks(trainer):
    from appo.tools.plot import read_curve

    out = subprocess.run(
        [sys.executable, "examples/launcher_with_hooks.py", f"--train_dir={trainer.train_dir}", "--env=CartPole-v1",
         "--experiment=evaluated", "--num_workers=1", "--num_envs_per_worker=8", "--train_for_env_steps=100000",
         "--eval_every_env_steps=20000", "--eval_episodes=3", "--experiment_summaries_interval=1", "--seed=3"],
        cwd=REPO, capture_output=True, text=True, timeout=140)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1].removeprefix("hook counts: "))
    assert counts["episodes"] > 10 and counts["iterations"] > 5 and counts["checkpoints"] >= 1, counts
    # Requests that come while one runs wait; on a busy machine the low-priority evaluator may serve only one.
    assert counts["evaluations"] >= 1 and counts["best_checkpoints"] >= 1, counts
    assert counts["episode_steps"] <= 100000 + 8 * 500  # each episode once

    exp_dir = os.path.join(trainer.train_dir, "evaluated")
    steps, rewards = read_curve(exp_dir, "eval/reward", 0, "env_steps")
    assert len(steps) == counts["evaluations"] and (rewards >= 8).all()  # CartPole returns at least 8
    _, episodes = read_curve(exp_dir, "eval/episodes", 0, "env_steps")
    assert (episodes == 3).all()
    # The best checkpoint is the evaluation with the highest mean return, apart from the rolling ones.
    with open(os.path.join(exp_dir, "checkpoint_p0", "best.json")) as f:
        best = json.load(f)
    assert best["metric"] == "reward" and best["value"] == pytest.approx(rewards.max(), rel=1e-5)
    best_path = os.path.join(exp_dir, "checkpoint_p0", "best.pth")
    policy = load_policy(best_path)
    assert (policy.version, policy.env_steps) == (best["version"], best["env_steps"])
    assert f"checkpoint {best_path}" in out.stdout  # the hook heard of it
    # enjoy replays it: deterministic episodes on the evaluation's first seeds give the same mean return.
    played = run_module("appo.enjoy", f"--train_dir={trainer.train_dir}", "--experiment=evaluated",
                        "--checkpoint=best", "--episodes=3", "--deterministic", "--seed=1000000")
    assert played.returncode == 0, played.stderr
    assert f"return {best['value']:.2f}" in played.stdout


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_hook_that_raises_stops_the_run_with_its_name(tmp_path, trainer):
    script = tmp_path / "raising_hook.py"
    script.write_text(
        "from appo.hooks import Hooks\nfrom appo import train\n"
        "def refuse(event):\n    raise RuntimeError('no checkpoints today')\n"
        f"result = train('CartPole-v1', hooks=Hooks(on_checkpoint=[refuse]), train_dir={trainer.train_dir!r}, "
        "experiment='hooked', num_workers=1, num_envs_per_worker=4, save_every_sec=1, train_for_seconds=60)\n"
        "print('RESULT', result.failed, result.completed, result.reason)\n")
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT True False the on_checkpoint hook refuse raised RuntimeError: no checkpoints today" in out.stdout
    assert "Traceback" in out.stdout + out.stderr  # logged with the traceback

    # Raised on the final checkpoint, whose report comes in as the run shuts down: it completed before.
    budget = "save_every_sec=3600, train_for_env_steps=3000"
    script.write_text(script.read_text().replace("experiment='hooked'", "experiment='hooked_at_the_end'")
                      .replace("save_every_sec=1, train_for_seconds=60", budget))
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT True False the on_checkpoint hook refuse raised RuntimeError: no checkpoints today" in out.stdout
    assert not os.path.exists(os.path.join(trainer.train_dir, "hooked_at_the_end", "done"))

    # sys.exit() in a hook left the run without its result.json and summary: it stops the run the same way.
    script.write_text(script.read_text().replace("raise RuntimeError('no checkpoints today')", "raise SystemExit(3)")
                      .replace("hooked_at_the_end", "exiting"))
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT True False the on_checkpoint hook refuse raised SystemExit: 3" in out.stdout
    assert os.path.exists(os.path.join(trainer.train_dir, "exiting", "result.json"))
