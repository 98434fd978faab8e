"""What the trainer reads from the info dict an env returns at an episode's end, for the actors' episode records
(appo/sampling/episodes.py) and for whole episodes played after training (appo/learning/trained_policy.py).

A multi-agent env may give a value per agent as a list; `episode_extra_stats` holds the env's own metrics (see
docs/guide_custom_metrics.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def for_agent(value: Any, agent: int) -> Any:
    """A value of a multi-agent env's last-step info that may be per agent: a list (tuple, 1-d array) holds one
    entry per agent (None when it has none for `agent`); anything else is the same for every agent."""
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
        return value[agent] if agent < len(value) else None
    return value


def extra_stats(info: dict, agent: int = 0) -> dict[str, float]:
    """An env's own episode metrics: the numeric values of `info["episode_extra_stats"]` at the end of an episode,
    a dict, or a list of one dict per agent (`agent`'s is taken); they are averaged per policy like the reward and
    written to tensorboard (episode_extra/)."""
    extra = for_agent(info.get("episode_extra_stats"), agent)
    if not isinstance(extra, dict):
        return {}
    return {str(k): float(v) for k, v in extra.items() if isinstance(v, (int, float, np.number)) and math.isfinite(v)}
