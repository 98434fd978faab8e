"""A trained policy in the caller's process: `load_policy(exp_dir or checkpoint)` then `act(obs)`.

It needs no trainer process: the run's `cfg.json` rebuilds the model, one throw-away env instance gives
the spaces (so a custom env must be registered or importable, as for training), and the checkpoint gives
the weights with their input-normalisation statistics. `act` takes a batch of observations (or a single
one) and returns actions in the form the env's `step` takes; a recurrent policy carries one state per
batch row from call to call until `reset`.

    from appo import load_policy
    policy = load_policy("train_dir/cartpole")
    action = policy.act(obs, deterministic=True)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from appo.config.cfg import Config, ConfigError, OneLineParser, env_kwargs, resolve, saved_config
from appo.config.views import EvaluatorConfig
from appo.envs import env_info
from appo.envs.info import extra_stats
from appo.envs.registry import whole_game_kwargs
from appo.learning.checkpoint import BEST_NAME, checkpoint_dir, latest_intact_checkpoint, load_checkpoint, parse_name
from appo.learning.model import ActorCritic
from appo.spaces import SINGLE_KEY, obs_as_dict, obs_spaces, to_env_action
from appo.utils.logs import log


class PolicyLoadError(Exception):
    """The experiment or checkpoint cannot be loaded; the message names the path and what is missing."""


def run_cfg(exp_dir: str) -> Config:
    """The flags a run was trained with: its saved `cfg.json`, with the defaults of the flags added since (a run
    saved by an older version lacks them)."""
    path = os.path.join(exp_dir, "cfg.json")
    if not os.path.exists(path):
        raise PolicyLoadError(f"{exp_dir}: no cfg.json; is it an experiment dir (train_dir/experiment)?")
    return saved_config(path)


def find_checkpoint(exp_dir_or_checkpoint: str, policy_id: int = 0) -> tuple[str, str]:
    """(experiment dir, checkpoint path): the newest intact checkpoint of `policy_id`, or of the policy whose
    `checkpoint_p<policy>/` folder is given, or the given file (a rolling checkpoint or the best one,
    `checkpoint_p<policy>/best.pth`)."""
    folder = os.path.normpath(exp_dir_or_checkpoint)
    parent, number = os.path.dirname(folder), os.path.basename(folder).removeprefix("checkpoint_p")
    if (number.isdigit() and folder == os.path.normpath(checkpoint_dir(parent, int(number)))
            and os.path.exists(os.path.join(parent, "cfg.json"))):
        exp_dir_or_checkpoint, policy_id = parent, int(number)
    if os.path.isfile(exp_dir_or_checkpoint):
        checkpoint = exp_dir_or_checkpoint
        exp_dir = os.path.dirname(os.path.dirname(os.path.abspath(checkpoint)))
        if os.path.basename(checkpoint) != BEST_NAME:
            try:
                parse_name(checkpoint)
            except ValueError as exc:
                raise PolicyLoadError(f"{checkpoint}: not a checkpoint (checkpoint_<version>_<env_steps>.pth or "
                                      f"{BEST_NAME})") from exc
        return exp_dir, checkpoint
    exp_dir = exp_dir_or_checkpoint
    if not os.path.isdir(exp_dir):
        if os.path.basename(exp_dir) == BEST_NAME and os.path.isdir(os.path.dirname(os.path.dirname(exp_dir))):
            raise PolicyLoadError(f"{exp_dir}: no best checkpoint: the run evaluated none (it is written by training "
                                  "with --eval_every_env_steps); leave --checkpoint out for the newest one")
        raise PolicyLoadError(f"{exp_dir}: no such experiment dir or checkpoint file")
    checkpoint = latest_intact_checkpoint(checkpoint_dir(exp_dir, policy_id))
    if checkpoint is None:
        trained = run_cfg(exp_dir).num_policies if os.path.exists(os.path.join(exp_dir, "cfg.json")) else None
        if trained is not None and not 0 <= policy_id < trained:
            raise PolicyLoadError(f"{exp_dir}: no policy {policy_id}: the run trained "
                                  f"{'policy 0' if trained == 1 else f'policies 0 to {trained - 1}'} (--policy)")
        raise PolicyLoadError(f"{exp_dir}: no checkpoint of policy {policy_id} in {checkpoint_dir(exp_dir, policy_id)}")
    return exp_dir, checkpoint


class TrainedPolicy:
    """A model with its spaces. `act` samples (or, deterministic, takes the most likely action)."""

    def __init__(self, model: ActorCritic, cfg: Config | EvaluatorConfig, obs_space: gym.Space, action_space: gym.Space,
                 num_agents: int, device: torch.device, exp_dir: str | None = None, checkpoint: str | None = None,
                 version: int = 0, env_steps: int = 0):
        self.model, self.cfg, self.device = model.eval(), cfg, device
        self.obs_space, self.action_space, self.num_agents = obs_space, action_space, num_agents
        self._obs_spaces = obs_spaces(obs_space)  # what `act` checks each call's observations against
        self.exp_dir, self.checkpoint = exp_dir, checkpoint
        self.version, self.env_steps = version, env_steps  # of the weights (the evaluator moves them on)
        self.rnn_states: torch.Tensor | None = None  # [batch, state size] while a recurrent policy is in use

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> Any:
        """Actions for a batch of observations [batch, *obs shape] (a dict of such arrays for Dict spaces): a
        list with one env action per row. A single observation gives a single action."""
        obs = obs_as_dict(obs)
        single = self._single(obs)
        tensors = {k: torch.as_tensor(np.asarray(v)[None] if single else np.asarray(v), device=self.device)
                   for k, v in obs.items()}
        batch = next(iter(tensors.values())).shape[0]
        if self.rnn_states is None or self.rnn_states.shape[0] != batch:
            self.rnn_states = torch.zeros(batch, self.model.state_size, device=self.device)
        params, _, self.rnn_states = self.model.forward_step(tensors, self.rnn_states)
        dist = self.model.distribution(params)
        actions = (dist.mode() if deterministic else dist.sample()).cpu().numpy()
        env_actions = [to_env_action(self.action_space, action) for action in actions]
        return env_actions[0] if single else env_actions

    def _single(self, obs: dict[str, Any]) -> bool:
        """Whether `obs` is one observation (else a batch of them), checked against the policy's spaces: a key
        missing or of another shape is one ValueError naming it (a shape error deep in the model, before)."""
        spaces = self._obs_spaces
        if set(obs) != set(spaces):
            raise ValueError(f"act: an observation of keys {sorted(obs)}, where the policy takes {sorted(spaces)}")
        forms = set()
        for key, space in spaces.items():
            shape = np.shape(obs[key])
            if shape == space.shape:
                forms.add(True)
            elif len(shape) == len(space.shape) + 1 and shape[1:] == space.shape and shape[0] > 0:
                forms.add(False)
            else:
                name = "the observation" if key == SINGLE_KEY else f"observation {key!r}"
                raise ValueError(f"act: {name} of shape {shape}, where the policy takes {space.shape} (one) or "
                                 f"[batch, *{space.shape}] (a batch of at least one)")
        if len(forms) > 1:
            raise ValueError("act: some keys hold one observation and others a batch")
        return forms.pop()

    def reset(self, rows: Any = None) -> None:
        """Forget the recurrent state of the given batch rows (an episode there ended), or of all of them."""
        if self.rnn_states is None:
            return
        if rows is None:
            self.rnn_states = None
        else:
            self.rnn_states[torch.as_tensor(rows, device=self.device)] = 0.0


def load_policy(exp_dir_or_checkpoint: str, policy_id: int = 0, device: str = "cpu",
                env_options: dict[str, Any] | None = None) -> TrainedPolicy:
    """The newest intact checkpoint of `policy_id` in an experiment dir, or a given checkpoint file. `env_options`
    are merged over the run's --env_kwargs: the policy then plays that env (a self-play policy against a bot), whose
    observation and action spaces must be the trained ones."""
    exp_dir, checkpoint = find_checkpoint(exp_dir_or_checkpoint, policy_id)
    cfg = run_cfg(exp_dir)
    if env_options:
        # Every seat plays this policy, so a self-play pool does not apply.
        cfg = dataclasses.replace(cfg, env_kwargs=json.dumps({**env_kwargs(cfg), **env_options}), self_play_opponents=0)
    if not 0 <= policy_id < cfg.num_policies:
        raise PolicyLoadError(f"--policy={policy_id}: {exp_dir} trained policies 0..{cfg.num_policies - 1}")
    info = env_info(cfg.env, env_kwargs(cfg), action_mask=cfg.action_mask)
    cfg = resolve(cfg, info.num_agents, info.turn_based)
    torch_device = torch.device(device)
    model = ActorCritic(info.obs_space, info.action_space, cfg).to(torch_device)
    try:
        state = load_checkpoint(checkpoint, torch_device)
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, EOFError, OSError) as exc:
        raise PolicyLoadError(f"{checkpoint}: cannot load ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    # A rolling checkpoint's name says its version and env steps; best.pth holds them inside.
    version, env_steps = (parse_name(checkpoint) if os.path.basename(checkpoint) != BEST_NAME
                          else (int(state["version"]), int(state["env_steps"])))
    return TrainedPolicy(model, cfg, info.obs_space, info.action_space, info.num_agents, torch_device, exp_dir,
                         checkpoint, version, env_steps)


# ---------------------------------------------------------------- playing whole episodes
@dataclass
class Episode:
    reward: float  # the mean over agents for a multi-agent env
    length: int
    extra: dict[str, float] = field(default_factory=dict)  # the env's info["episode_extra_stats"] at the end


def episode_env_kwargs(cfg: Config | EvaluatorConfig) -> dict[str, Any]:
    """The run's env kwargs for playing whole episodes: an env that training scores by whole games (Atari, ale-py's or
    EnvPool's) plays whole games with unclipped scores, the score training records."""
    return {**env_kwargs(cfg), **whole_game_kwargs(cfg.env)}


def summarise(episodes: list[Episode]) -> dict[str, float]:
    """Mean return (`reward`) and length with their spreads (population std), the episode count, and the mean of
    each episode metric the env reports. A NaN or infinite return (a broken env) is left out of the return's mean and
    std, so one bad episode does not hide the others, and counted as `reward_nonfinite` (when there is one)."""
    rewards = np.asarray([e.reward for e in episodes], dtype=np.float64)
    lengths = np.asarray([e.length for e in episodes], dtype=np.float64)
    finite = rewards[np.isfinite(rewards)]
    results = {"reward": float(finite.mean()) if finite.size else math.nan,
               "reward_std": float(finite.std()) if finite.size else math.nan,
               "length": float(lengths.mean()), "length_std": float(lengths.std()),
               "episodes": float(len(episodes))}
    if finite.size < rewards.size:
        results["reward_nonfinite"] = float(rewards.size - finite.size)
    for name in sorted({name for e in episodes for name in e.extra}):
        values = [e.extra[name] for e in episodes if name in e.extra]
        results.setdefault(name, float(np.mean(values)))
    return results


def play(policy: TrainedPolicy, envs: list[gym.Env], episodes: int, deterministic: bool, max_frames: int, seed: int,
         capture: Callable[[Any], None] | None = None, log_episodes: bool = True) -> list[Episode]:
    """Play `episodes` episodes on `envs` side by side, one forward pass per step for all of them, and at most
    `max_frames` env steps in all. Episode k starts from seed `seed + k` whichever env plays it, so a
    deterministic policy plays the same episodes however many envs share them. Returns the finished
    episodes in order. `capture(obs)` sees every observation of env 0 before the policy acts on it (video)."""
    agents = policy.num_agents  # rows of the batch per env: a multi-agent env's observation has one per agent
    envs = envs[:episodes]
    obs: list[Any] = [None] * len(envs)
    playing: list[Episode | None] = [None] * len(envs)  # the episode each env is in (reward and length so far)
    index = [0] * len(envs)  # which episode that is
    finished: dict[int, Episode] = {}
    started = steps = 0
    policy.reset()

    def start(i: int) -> None:
        nonlocal started
        obs[i], _ = envs[i].reset(seed=seed + started)
        playing[i], index[i] = Episode(0.0, 0), started
        policy.reset(list(range(i * agents, (i + 1) * agents)))
        started += 1

    def rows(o: Any) -> np.ndarray:
        return np.asarray(o) if agents > 1 else np.asarray(o)[None]

    for i in range(len(envs)):
        start(i)
    while any(playing) and steps < max_frames:
        if capture is not None and playing[0] is not None:
            capture(obs[0])
        # Every env keeps its rows (and recurrent state) in the batch; an idle one repeats its last observation.
        if isinstance(obs[0], dict):
            batch = {key: np.concatenate([rows(o[key]) for o in obs]) for key in obs[0]}
        else:
            batch = np.concatenate([rows(o) for o in obs])
        actions = policy.act(batch, deterministic=deterministic)
        for i, env in enumerate(envs):
            episode = playing[i]
            if episode is None:
                continue
            action = actions[i * agents:(i + 1) * agents] if agents > 1 else actions[i]
            obs[i], reward, terminated, truncated, info = env.step(action)
            episode.reward += float(np.mean(reward))
            episode.length += 1
            steps += 1
            if terminated or truncated:
                episode.extra = extra_stats(info)
                finished[index[i]] = episode
                if log_episodes:
                    log.info("Episode %d: return %.2f, length %d", index[i] + 1, episode.reward, episode.length)
                playing[i] = None
                if started < episodes:
                    start(i)
    return [finished[k] for k in sorted(finished)]


def command_parser(prog: str, description: str, policy_help: str) -> argparse.ArgumentParser:
    """The parser of a command that loads a trained policy (enjoy, export), with the flags that say which."""
    parser = OneLineParser(prog=prog, description=description, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--experiment", type=str, default=None, help="Experiment name (a folder under --train_dir).")
    add("--train_dir", type=str, default="train_dir", help="Folder holding the experiments.")
    add("--checkpoint", type=str, default=None,
        help="A checkpoint file to load instead of the newest one; best: the best evaluated weights "
             "(checkpoint_p<policy>/best.pth, kept when training ran with --eval_every_env_steps).")
    add("--policy", type=int, default=0, help=policy_help)
    return parser


def policy_source(args: argparse.Namespace) -> str:
    """The checkpoint file or experiment dir the flags of `command_parser` name (`--checkpoint=best`: the
    policy's best evaluated weights)."""
    if args.experiment is None and (args.checkpoint is None or args.checkpoint == "best"):
        raise ConfigError("--experiment (or --checkpoint=PATH) is required")
    if args.checkpoint == "best":
        return os.path.join(checkpoint_dir(os.path.join(args.train_dir, args.experiment), args.policy), BEST_NAME)
    return args.checkpoint or os.path.join(args.train_dir, args.experiment)
