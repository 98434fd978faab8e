"""ViZDoom as `--env=doom_<scenario>`: the scenarios the vizdoom wheel ships (envs/doom/scenarios.py; docs/doom.md
lists the few .cfg files not offered, and why), games against Doom's bots, and (envs/doom/multiplayer.py) matches
between learning agents.

    python -m appo.train --env=doom_basic
    python -m appo.train --env=doom_multi_duel --env_kwargs='{"num_bots": 1, "bot_skill": 40}'

`pip install -e ".[doom]"`; the guide is docs/doom.md.
"""

from __future__ import annotations

from typing import Any

from appo.envs.doom.scenarios import SCENARIOS
from appo.envs.registry import EnvError

DOOM_PREFIX = "doom_"


def is_doom_name(name: str) -> bool:
    return name.startswith(DOOM_PREFIX)


def make_doom(name: str, **kwargs: Any):
    """The env for `--env=doom_<scenario>`; `kwargs` are DoomEnv's options (frame_skip, num_bots, bot_skill,
    episode_tics, reward_shaping, render_mode). With `num_agents` > 1 (hosted deathmatch maps only) it is a
    DoomMatchEnv: that many learning agents in one match, each in its own game (envs/doom/multiplayer.py)."""
    scenario = SCENARIOS.get(name[len(DOOM_PREFIX):])
    if scenario is None:
        raise EnvError(f"--env={name}: unknown Doom scenario; use one of "
                       f"{', '.join(DOOM_PREFIX + key for key in SCENARIOS)}")
    from appo.envs.doom.env import DoomEnv
    from appo.envs.doom.multiplayer import DoomMatchEnv

    num_agents = kwargs.pop("num_agents", 1)
    try:
        if num_agents > 1:
            return DoomMatchEnv(name, scenario, num_agents=num_agents, **kwargs)
        return DoomEnv(name, scenario, **kwargs)
    except TypeError as exc:
        raise EnvError(f"--env_kwargs for {name}: {exc}") from exc
