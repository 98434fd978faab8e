"""Learning: the model, the PPO losses, the learner process, weights publication, checkpoints, evaluation.

Uses torch; only the learner, inference and evaluator processes (and the after-training tools) import it.
"""
