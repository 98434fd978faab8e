"""The Doom scenarios `--env=doom_<name>` offers, each with what its reward means: the vizdoom wheel's, but for the
few .cfg files made for what this env does not give (sound, text messages, game files the wheel lacks), which
docs/doom.md lists with why.

Rewards are in each scenario's own units (its .cfg and map script), unchanged, so returns compare with published
ViZDoom numbers; "tic" is one of Doom's 35 game frames a second, and one env step is `frame_skip` = 4 tics.
The hosted deathmatch maps (cig, multi_duel, multi_deathmatch) are games against Doom's built-in bots, with the
shaped reward of `envs/doom/shaping.py` (frags, deaths, damage, pickups) instead of a map script's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    cfg: str  # the .cfg in vizdoom.scenarios_path
    reward: str  # what the return measures, in the scenario's units
    good_return: float | None = None  # a mean return a good policy reaches (the threshold our docs time to)
    full_actions: bool = False  # the deathmatch action set instead of the .cfg's buttons (envs/doom/actions.py)
    bots: int = 0  # a hosted deathmatch game with this many built-in bots by default
    timeout_tics: int | None = None  # overrides the .cfg's episode_timeout (None: keep it)


SCENARIOS: dict[str, Scenario] = {
    "basic": Scenario("basic.cfg", "+101 for killing the one monster (ends the episode), -5 per missed shot, -1 per "
                      "tic; 300-tic timeout. Random play about -170; a good policy 80+", good_return=80.0),
    "simpler_basic": Scenario("simpler_basic.cfg", "as basic, on a plainer-looking room"),
    "rocket_basic": Scenario("rocket_basic.cfg", "as basic, with a rocket launcher and no auto-aim"),
    "defend_the_center": Scenario("defend_the_center.cfg", "+1 per kill, -1 for dying (ends the episode); 26 "
                                  "bullets, monsters come from every side; 2100-tic timeout", good_return=10.0),
    "defend_the_line": Scenario("defend_the_line.cfg", "+1 per kill, -1 for dying; monsters respawn across the room"),
    "health_gathering": Scenario("health_gathering.cfg", "+1 per tic alive, -100 for dying; acid floor, medkits; "
                                 "2100-tic timeout (2100 at most)", good_return=1500.0),
    "health_gathering_supreme": Scenario("health_gathering_supreme.cfg", "as health_gathering, on a maze with "
                                         "poison vials"),
    "my_way_home": Scenario("my_way_home.cfg", "+1 for reaching the vest in a maze of rooms, -0.0001 per tic; "
                            "2100-tic timeout"),
    "deadly_corridor": Scenario("deadly_corridor.cfg", "+ the distance gained towards the vest, - the distance "
                                "lost, -100 for dying; shooting monsters line the corridor"),
    "predict_position": Scenario("predict_position.cfg", "+1 for hitting the moving monster with the one rocket, "
                                 "-0.001 per tic; 300-tic timeout"),
    "take_cover": Scenario("take_cover.cfg", "+1 per tic alive, dodging fireballs (no timeout)"),
    "freedoom2": Scenario("freedoom2.cfg", "+1 for reaching the exit of MAP01 of Freedoom: Phase 2 (a map of the "
                          "full game: monsters, weapons, doors opened with USE; the status bar shown); 126000-tic "
                          "(an hour) timeout"),
    "deathmatch": Scenario("deathmatch.cfg", "the map's kill rewards against waves of monsters, with weapons and "
                           "pickups; 4200-tic timeout", full_actions=True),
    "cig": Scenario("cig.cfg", "shaped deathmatch reward (envs/doom/shaping.py) against built-in bots on the "
                    "CIG competition map; 2 minutes", full_actions=True, bots=7, timeout_tics=4200),
    "multi_duel": Scenario("multi_duel.cfg", "shaped deathmatch reward, one against one built-in bot; 2 minutes",
                           full_actions=True, bots=1, timeout_tics=4200),
    "multi_deathmatch": Scenario("multi.cfg", "shaped deathmatch reward against 7 built-in bots on "
                                 "multi_deathmatch.wad; 2 minutes", full_actions=True, bots=7, timeout_tics=4200),
}
