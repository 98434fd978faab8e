"""Doom's buttons as a MultiDiscrete action space: one choice per group of buttons that exclude each other.

A scenario's .cfg lists buttons; pressing opposite ones at once (MOVE_LEFT with MOVE_RIGHT) only cancels out, so
each pair of opposites becomes one 3-way choice (none, one, the other), every other button a 2-way choice (up,
down), and a turning delta (TURN_LEFT_RIGHT_DELTA: degrees per tic) a choice among TURN_BINS evenly spaced
values. basic's MOVE_LEFT, MOVE_RIGHT, ATTACK become MultiDiscrete([3, 2]): 6 actions, none redundant.

The deathmatch set (FULL_BUTTONS, for the deathmatch maps) is move (forward/back), strafe, attack, sprint, weapon
(next/previous) and turn: MultiDiscrete([3, 3, 2, 2, 3, 11]); at frame skip 4 a turn bin is 9 degrees a step, up
to 45 degrees a step either way. Buttons are names here (strings), so this module needs no vizdoom.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

OPPOSITES = (("MOVE_FORWARD", "MOVE_BACKWARD"), ("MOVE_LEFT", "MOVE_RIGHT"), ("TURN_LEFT", "TURN_RIGHT"),
             ("SELECT_NEXT_WEAPON", "SELECT_PREV_WEAPON"), ("LOOK_UP", "LOOK_DOWN"))
TURN_DELTA = "TURN_LEFT_RIGHT_DELTA"
TURN_BINS = 11
MAX_TURN_DEGREES_PER_TIC = 11.25
FULL_BUTTONS = ("MOVE_FORWARD", "MOVE_BACKWARD", "MOVE_LEFT", "MOVE_RIGHT", "ATTACK", "SPEED", "SELECT_NEXT_WEAPON",
                "SELECT_PREV_WEAPON", TURN_DELTA)


class ActionSet:
    """The MultiDiscrete space over `buttons` and the map from one of its actions to the button values."""

    def __init__(self, buttons: list[str] | tuple[str, ...]):
        self.buttons = list(buttons)
        rows: list[list[np.ndarray]] = []  # per choice group: the button vector of each choice
        grouped: set[str] = set()
        for name in self.buttons:
            if name in grouped:
                continue
            pair = next((p for p in OPPOSITES if name in p and all(b in self.buttons for b in p)), None)
            members = pair or (name,)
            grouped.update(members)
            if name == TURN_DELTA:
                values = np.linspace(-MAX_TURN_DEGREES_PER_TIC, MAX_TURN_DEGREES_PER_TIC, TURN_BINS)
                rows.append([self._press({name: v}) for v in values])
            else:
                rows.append([self._press({})] + [self._press({member: 1.0}) for member in members])
        self.space = gym.spaces.MultiDiscrete([len(group) for group in rows])
        self._offsets = np.cumsum([0] + [len(group) for group in rows[:-1]])
        self._table = np.stack([row for group in rows for row in group])  # [all choices, buttons]

    def _press(self, values: dict[str, float]) -> np.ndarray:
        row = np.zeros(len(self.buttons))
        for name, value in values.items():
            row[self.buttons.index(name)] = value
        return row

    def to_buttons(self, action: np.ndarray) -> list[float]:
        """One action of `space` as the button values `DoomGame.make_action` takes."""
        return self._table[self._offsets + np.asarray(action, dtype=np.int64)].sum(axis=0).tolist()
