"""The reward of a deathmatch against bots (or other agents), shaped from the game's counters, and its metrics.

A frag (+1) is rare for a policy that has not learnt to aim, so the reward also pays a little for what leads to
frags: damage dealt, and health, armour, ammunition and weapons picked up; dying costs. Every coefficient is a
reward-shaping coefficient PBT may change within BOUNDS (the env implements `get_reward_shaping`,
`set_reward_shaping`, `get_reward_shaping_bounds`; envs/registry.py `reward_shaping`). The true objective, what
PBT ranks by when told so (`--pbt_target_objective=true_objective`), is the episode's frags.

Counters come from the engine's game variables once per step (`COUNTERS`, in that order). Doom resets health,
armour, ammunition and weapons when a player respawns, so a step with a death pays no pickups.
"""

from __future__ import annotations

import numpy as np

# name -> (default coefficient, PBT bounds)
COEFFICIENTS: dict[str, tuple[float, tuple[float, float]]] = {
    "frag": (1.0, (0.5, 2.0)),
    "death": (-1.0, (-2.0, 0.0)),
    "damage_dealt": (0.01, (0.0, 0.05)),  # per hit point of damage
    "health_pickup": (0.005, (0.0, 0.02)),  # per hit point
    "armor_pickup": (0.005, (0.0, 0.02)),  # per point
    "ammo_pickup": (0.1, (0.0, 0.5)),  # per full load of one ammunition type (AMMO_CAPACITY)
    "weapon_pickup": (0.2, (0.0, 1.0)),  # per new weapon
}
DEFAULTS = {name: value for name, (value, _) in COEFFICIENTS.items()}
BOUNDS = {name: bounds for name, (_, bounds) in COEFFICIENTS.items()}

AMMO_CAPACITY = {"AMMO2": 200.0, "AMMO3": 50.0, "AMMO5": 50.0, "AMMO6": 300.0}  # bullets, shells, rockets, cells
WEAPONS = tuple(f"WEAPON{i}" for i in range(1, 8))
COUNTERS = ("FRAGCOUNT", "DEATHCOUNT", "DAMAGECOUNT", "HEALTH", "ARMOR", *AMMO_CAPACITY, *WEAPONS)


def shaped_reward(before: np.ndarray, after: np.ndarray, coefficients: dict[str, float]) -> float:
    """The reward of one step from the COUNTERS before and after it."""
    frags, deaths, damage, health, armor = (after[:5] - before[:5]).tolist()
    reward = coefficients["frag"] * frags + coefficients["death"] * deaths + coefficients["damage_dealt"] * damage
    if deaths == 0:
        ammo = (after[5:9] - before[5:9]) / np.array(list(AMMO_CAPACITY.values()))
        new_weapons = np.sum((after[9:] > 0) & (before[9:] <= 0))
        reward += (coefficients["health_pickup"] * max(health, 0.0) + coefficients["armor_pickup"] * max(armor, 0.0)
                   + coefficients["ammo_pickup"] * float(np.clip(ammo, 0.0, None).sum())
                   + coefficients["weapon_pickup"] * float(new_weapons))
    return float(reward)


def match_stats(start: np.ndarray, now: np.ndarray, opponent_frags: float) -> dict[str, float]:
    """Episode metrics from the COUNTERS at its start and now: frags, deaths, damage dealt, and the frag
    difference against the best other player (`opponent_frags`: their frags this episode)."""
    frags, deaths, damage = (now[:3] - start[:3]).tolist()
    return {"frags": frags, "deaths": deaths, "frag_difference": frags - opponent_frags, "damage_dealt": damage}


def with_counters(measurements: tuple[str, ...]) -> tuple[tuple[str, ...], np.ndarray]:
    """The game variables a deathmatch env reads each step: its measurements, then the COUNTERS not among them;
    and where each of COUNTERS sits in that tuple."""
    variables = measurements + tuple(name for name in COUNTERS if name not in measurements)
    return variables, np.array([variables.index(name) for name in COUNTERS], dtype=np.int64)


class ShapedReward:
    """The reward-shaping interface PBT uses (envs/registry.py `reward_shaping`) over the env's `shaping` dict;
    an env whose reward is not shaped this time (`shaped` False: a single-player scenario) declares none."""

    shaping: dict[str, float]
    shaped: bool = True

    def get_reward_shaping(self) -> dict[str, float]:
        return dict(self.shaping) if self.shaped else {}

    def set_reward_shaping(self, scheme: dict[str, float]) -> None:
        self.shaping.update({key: float(value) for key, value in scheme.items() if key in self.shaping})

    def get_reward_shaping_bounds(self) -> dict[str, tuple[float, float]]:
        return dict(BOUNDS) if self.shaped else {}
