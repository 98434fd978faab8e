"""stable-baselines3's PPO on a gymnasium task, at its defaults plus the hyper-parameters a flag gives: a peer's
number measured on this machine, beside the published one (docs/benchmarks.md quotes RL Zoo's tuned PPO).

    python scripts/sb3_reference.py --env=Swimmer-v5 --seed=0 --gamma=0.9999 --time_feature --out=sw_0.json

RL Zoo's PPO entry for Swimmer (hyperparams/ppo.yml; the model card of its published agent lists the same) is
stable-baselines3's defaults with gamma 0.9999, observations normalised (VecNormalize, rewards not) and its
TimeFeatureWrapper (the fraction of the time limit left, appended to the observation): the flags above. The
defaults it leaves: one env, 2,048 steps a rollout, minibatches of 64, 10 epochs, learning rate 3e-4, clip 0.2,
lambda 0.95, 64x64 tanh MLPs for the policy and the value, state-independent log std starting at 0.

stable-baselines3 is not a dependency of this project: install it where the project is
(`pip install stable-baselines3`; it takes the torch, gymnasium and numpy already there). One process, one thread.
Prints and writes (--out, JSON) the mean return of the last 100 training episodes, the mean of 10 deterministic
evaluation episodes (observation statistics frozen), the env steps and the wall time.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch


class TimeLeft(gym.ObservationWrapper):
    """The observation with one more entry: the fraction of the env's time limit still to run (1 at reset)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.limit = env.spec.max_episode_steps
        space = env.observation_space
        self.observation_space = gym.spaces.Box(np.append(space.low, 0.0).astype(np.float32),
                                                np.append(space.high, 1.0).astype(np.float32), dtype=np.float32)
        self.steps = 0

    def reset(self, **kwargs):
        self.steps = 0
        return super().reset(**kwargs)

    def step(self, action):
        self.steps += 1
        return super().step(action)

    def observation(self, observation):
        return np.append(observation, 1.0 - self.steps / self.limit).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", required=True, help="A gymnasium id.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env_steps", type=int, default=1_000_000)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--time_feature", action="store_true", help="Append the fraction of the time limit left.")
    parser.add_argument("--no_normalize", action="store_true", help="Leave observations unnormalised.")
    parser.add_argument("--eval_episodes", type=int, default=10)
    parser.add_argument("--out", help="Write the result as JSON here.")
    args = parser.parse_args()
    if not 0 < args.gamma <= 1 or args.env_steps < 1 or args.eval_episodes < 1:
        parser.error("--gamma must be in (0, 1], --env_steps and --eval_episodes 1 or more")
    try:
        gym.make(args.env).close()
    except (gym.error.Error, ImportError) as exc:
        parser.error(f"--env={args.env}: cannot be made ({exc})")
    if args.time_feature and gym.spec(args.env).max_episode_steps is None:
        parser.error(f"--time_feature: --env={args.env} has no time limit to count down")
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.monitor import Monitor
        from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    except ModuleNotFoundError:
        raise SystemExit("sb3_reference.py: stable-baselines3 is not installed here (pip install stable-baselines3)") \
            from None
    torch.set_num_threads(1)

    def make() -> gym.Env:
        env = gym.make(args.env)
        return Monitor(TimeLeft(env) if args.time_feature else env)

    envs = DummyVecEnv([make])
    if not args.no_normalize:
        envs = VecNormalize(envs, norm_obs=True, norm_reward=False, gamma=args.gamma)
    model = PPO("MlpPolicy", envs, gamma=args.gamma, seed=args.seed, verbose=0)
    started = time.monotonic()
    model.learn(args.env_steps)
    wall_s = time.monotonic() - started
    returns = envs.envs[0].get_episode_rewards() if args.no_normalize else envs.venv.envs[0].get_episode_rewards()

    if not args.no_normalize:
        envs.training = False
    evaluation: list[float] = []
    obs = envs.reset()
    while len(evaluation) < args.eval_episodes:
        action, _ = model.predict(obs, deterministic=True)
        obs, _, done, info = envs.step(action)
        if done[0]:
            evaluation.append(float(info[0]["episode"]["r"]))
    result = {"env": args.env, "seed": args.seed, "gamma": args.gamma, "time_feature": args.time_feature,
              "normalize": not args.no_normalize, "env_steps": args.env_steps, "wall_s": round(wall_s, 1),
              "last_100_episodes": float(np.mean(returns[-100:])), "deterministic_eval": float(np.mean(evaluation)),
              "episodes": len(returns)}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
