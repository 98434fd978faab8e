"""The Python API end to end, in one process: train CartPole with `train()` until the mean reward over the
last 100 episodes reaches 475, load the newest checkpoint with `load_policy()` and play 20 episodes.

    python scripts/api_cartpole.py [--train_dir train_dir] [--episodes 20]

Prints the playing progress, then one JSON line: the training result and the mean return of the episodes.
"""

from __future__ import annotations

import argparse
import json
import statistics

import gymnasium as gym

from appo import load_policy, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_dir", default="train_dir")
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()

    result = train(env="CartPole-v1", experiment="api_cartpole", train_dir=args.train_dir, target_reward=475,
                   train_for_seconds=240, restart=True)
    print(f"trained: {result.reason}; {result.env_steps} env steps; stats {result.stats}", flush=True)

    policy = load_policy(result.exp_dir)
    env = gym.make("CartPole-v1")
    returns = []
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs, deterministic=True))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    print(json.dumps({"completed": result.completed, "env_steps": result.env_steps, "checkpoint": result.checkpoint,
                      "returns": returns, "mean_return": statistics.mean(returns)}))


if __name__ == "__main__":
    main()
