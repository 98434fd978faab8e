"""APPO: an asynchronous PPO trainer (actor workers, batched inference workers, one learner per policy)."""
