"""A user's --policy_mapping function (used by tests/test_selfplay_run.py)."""

import numpy as np


def one_of_each(num_agents: int, num_policies: int, rng: np.random.Generator) -> list[int]:
    """Every game puts different policies against each other: a random rotation of 0, 1, ..."""
    first = int(rng.integers(num_policies))
    return [(first + i) % num_policies for i in range(num_agents)]
