"""Sampling: actor workers that step envs (actor_worker, with env_stepper, slots, episodes, agent_policies), the
inference workers that answer them, and the sampler group (both on one machine: their queues, hung actors).

Torch-free except `inference_worker` (tests/test_layout.py checks it): actors never import torch.
"""
