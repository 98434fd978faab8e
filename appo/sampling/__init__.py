"""Sampling: actor workers that step envs, the inference workers that answer them, and their group.

Torch-free except `inference_worker` (tests/test_layout.py checks it): actors never import torch.
"""
