"""Watch or evaluate a trained policy in one process, without the trainer.

    python -m appo.enjoy --experiment=cartpole --episodes=10 --deterministic --save_video

Loads the newest intact checkpoint (or `--checkpoint`) with the run's `cfg.json`, plays `--episodes`
episodes and prints the mean and std of the return and length. `--save_video` writes an mp4 of the env's
`render_mode="rgb_array"` frames (Atari: the full-resolution screen, not the 84x84 input), or of every frame the
env renders when it offers `"rgb_array_list"` (Doom: each tic of a frame-skipped step, at 35 frames a second), or
of the observations when the env renders none but observes images (MuJoCo on a machine without a display renders
with MUJOCO_GL=egl); an experiment trained with a tracker on
(--with_wandb, --with_mlflow) gets the video in its tracker run too. Multi-agent envs are played with every agent
on the chosen `--policy`; an episode's return is the mean over its agents.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from appo.config.cfg import ConfigError, env_kwargs, str2bool
from appo.envs import EnvError, make_env
from appo.learning.trained_policy import (
    Episode,
    PolicyLoadError,
    TrainedPolicy,
    command_parser,
    episode_env_kwargs,
    load_policy,
    play,
    policy_source,
    summarise,
)
from appo.spaces import channels_last
from appo.tracking import send_file
from appo.tracking.writer import one_line
from appo.utils.logs import log, setup_logging
from appo.utils.process import EXIT_BAD_INPUT


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("python -m appo.enjoy", __doc__, "Which policy of a multi-policy run plays.")
    add = parser.add_argument
    add("--episodes", type=int, default=10, help="Episodes to play.")
    add("--deterministic", type=str2bool, nargs="?", const=True, default=False,
        help="Take the most likely action instead of sampling one.")
    add("--max_frames", type=int, default=1_000_000,
        help="Stop after this many env steps in all, even before --episodes are done (an unfinished episode "
             "is not counted).")
    add("--save_video", type=str2bool, nargs="?", const=True, default=False, help="Write an mp4 of the episodes.")
    add("--video_dir", type=str, default=None, help="Where the mp4 goes (default: <experiment dir>/videos).")
    add("--fps", type=float, default=None,
        help="Frames per second of the video (default: the env's render_fps over its frame skip, else 30).")
    add("--seed", type=int, default=0, help="Episode k starts from seed SEED + k.")
    add("--device", type=str, default="cpu", help="Torch device for the model.")
    add("--env_kwargs", type=str, default="{}",
        help="A JSON object merged over the run's --env_kwargs, e.g. to play a Doom self-play policy against a bot: "
             "'{\"num_agents\": 1, \"num_bots\": 1}'. The observation and action spaces must stay the trained ones.")
    return parser


class Recorder:
    """Streams frames into an mp4 (imageio's ffmpeg writer): the env's rgb_array render, or the image
    observation. Frames are written as they come, so a long video does not sit in memory."""

    def __init__(self, env: gym.Env, from_render: bool, path: str, fps: float):
        import imageio.v2 as imageio  # the ffmpeg writer comes with imageio-ffmpeg

        self.env, self.from_render, self.path = env, from_render, path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.writer = imageio.get_writer(path, fps=fps, macro_block_size=2)
        self.frames, self.size = 0, (0, 0)

    def capture(self, obs) -> None:
        if not self.from_render:
            rendered = image_from_obs(obs)
        else:
            rendered = self.env.render() if self.frames else first_render(self.env)
        for frame in rendered if isinstance(rendered, list) else [rendered]:  # rgb_array_list: every frame
            frame = np.asarray(frame, dtype=np.uint8)
            self.writer.append_data(frame)
            self.frames, self.size = self.frames + 1, (frame.shape[1], frame.shape[0])

    def close(self) -> None:
        self.writer.close()


def opengl_hint(exc: BaseException | None) -> str:
    """How to pick MuJoCo's OpenGL backend, when `exc` (or what caused it) is an OpenGL failure: its message names
    OpenGL or MUJOCO_GL, or OpenGL's or MuJoCo's GL set-up code raised it (no display, or no library for the backend
    MUJOCO_GL names); else ''."""
    while exc is not None:
        files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
        if ("OpenGL" in str(exc) or "MUJOCO_GL" in str(exc)
                or any(f"{os.sep}OpenGL{os.sep}" in file or file.endswith("gl_context.py") for file in files)):
            backend = os.environ.get("MUJOCO_GL")
            asked = "MUJOCO_GL unset" if backend is None else f"MUJOCO_GL={backend}"
            other = "osmesa" if backend == "egl" else "egl"
            return f"; MuJoCo's OpenGL ({asked}) does not work here: set MUJOCO_GL={other}"
        exc = exc.__cause__
    return ""


def first_render(env: gym.Env) -> Any:
    """The env's first frame. That render sets the renderer up (MuJoCo: an OpenGL context), so its failure is the
    machine's: one line (EnvError) saying so, without the warnings the failed set-up gave (GLFW: no DISPLAY)."""
    with warnings.catch_warnings(record=True) as caught:
        try:
            rendered = env.render()
        except Exception as exc:
            message = (f"--save_video: the env cannot render frames ({one_line(exc)}){opengl_hint(exc)}; or play "
                       "without --save_video")
            # What the failed call half made (MuJoCo's viewer) would print another traceback as it is collected.
            hook, sys.unraisablehook = sys.unraisablehook, lambda _: None
            try:
                traceback.clear_frames(exc.__traceback__)
            finally:
                sys.unraisablehook = hook
            raise EnvError(message) from None
    for warning in caught:
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno, warning.file,
                             warning.line)
    return rendered


def image_from_obs(obs) -> np.ndarray:
    """An RGB frame [H, W, 3] from an image observation: channels-last RGB as is, else the last channel (the newest
    frame of stacked grayscale frames) at the end `channels_last` reads as the channels."""
    image = np.asarray(obs.get("obs", next(iter(obs.values()))) if isinstance(obs, dict) else obs)
    if image.ndim == 3 and image.shape[-1] == 3:
        return image
    if image.ndim == 3:
        image = image[..., -1] if channels_last(image.shape) else image[-1]
    return np.repeat(image[..., None], 3, axis=-1)


def make_play_env(policy: TrainedPolicy, video_path: str | None, fps: float | None
                  ) -> tuple[gym.Env, Recorder | None]:
    """The run's env (Atari: whole games with unclipped scores); with a video, asked to render rgb_array
    frames, or observed as images when it cannot."""
    kwargs = episode_env_kwargs(policy.cfg)
    if video_path is None:
        return make_env(policy.cfg.env, kwargs, action_mask=policy.cfg.action_mask), None
    try:
        env = make_env(policy.cfg.env, kwargs, render_mode="rgb_array", action_mask=policy.cfg.action_mask)
        modes = env.metadata.get("render_modes", [])
        if "rgb_array_list" in modes:
            env.close()
            env = make_env(policy.cfg.env, kwargs, render_mode="rgb_array_list", action_mask=policy.cfg.action_mask)
        if "rgb_array" in modes or "rgb_array_list" in modes:
            return env, Recorder(env, True, video_path, fps or video_fps(env))
        env.close()
    except TypeError:  # a make function without a render_mode argument
        pass
    env = make_env(policy.cfg.env, kwargs, action_mask=policy.cfg.action_mask)
    image = isinstance(policy.obs_space, gym.spaces.Box) and policy.obs_space.dtype == np.uint8
    if not image:
        env.close()
        raise EnvError(f"--save_video: --env={policy.cfg.env} renders no rgb_array frames and does not observe "
                       "images; play without --save_video")
    return env, Recorder(env, False, video_path, fps or video_fps(env))


def video_fps(env: gym.Env) -> float:
    """Real time: the env's render_fps, over the emulator frames one step advances (Atari's frame skip) when only
    a step's last frame is rendered."""
    render_fps = env.metadata.get("render_fps")
    if not render_fps:
        return 30.0
    every_frame = getattr(env, "render_mode", None) == "rgb_array_list"
    return float(render_fps) / (1 if every_frame else int(getattr(env, "frames_per_step", 1)))


def summary(episodes: list[Episode]) -> str:
    """The line enjoy ends with: the mean and spread of the return and length, and of the env's episode metrics."""
    if not episodes:
        return "no episode finished; raise --max_frames"
    results = summarise(episodes)
    metrics = "".join(f", {name} {results[name]:.2f}" for name in sorted({n for e in episodes for n in e.extra}))
    nonfinite = int(results.get("reward_nonfinite", 0))
    left_out = f" ({nonfinite} with a NaN or infinite return left out)" if nonfinite else ""
    return (f"{len(episodes)} episodes: return {results['reward']:.2f} ± {results['reward_std']:.2f}{left_out}, "
            f"length {results['length']:.1f} ± {results['length_std']:.1f}{metrics}")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.episodes < 1 or args.max_frames < 1:
            raise ConfigError("--episodes and --max_frames must be 1 or more")
        if args.fps is not None and not args.fps > 0:
            raise ConfigError(f"--fps={args.fps:g}: must be more than 0 (or left out: the env's own rate)")
        source = policy_source(args)
        setup_logging()
        policy = load_policy(source, args.policy, args.device, env_kwargs(args))
        video_path = None
        if args.save_video:
            video_dir = args.video_dir or os.path.join(policy.exp_dir, "videos")
            video_path = os.path.join(video_dir, f"policy{args.policy}_v{policy.version}.mp4")
        env, recorder = make_play_env(policy, video_path, args.fps)
    except (PolicyLoadError, ConfigError, EnvError) as exc:
        # Importing MuJoCo fails (an EnvError caused by OpenGL's import) when MUJOCO_GL names a library not installed.
        print(f"appo.enjoy: error: {exc}{opengl_hint(exc.__cause__)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    log.info("Playing policy %d of %s (version %d, %d env steps)", args.policy, policy.checkpoint, policy.version,
             policy.env_steps)
    try:
        episodes = play(policy, [env], args.episodes, args.deterministic, args.max_frames, args.seed,
                        None if recorder is None else recorder.capture)
    except EnvError as exc:
        print(f"appo.enjoy: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        env.close()
        if recorder is not None:
            recorder.close()
    print(summary(episodes), flush=True)
    if recorder is not None:
        width, height = recorder.size
        print(f"video: {recorder.path} ({recorder.frames} frames of {width}x{height})", flush=True)
        send_file(policy.cfg, policy.exp_dir, recorder.path, "videos")  # to the tracker runs the experiment has
    return 0 if episodes else 1


if __name__ == "__main__":
    sys.exit(main())
