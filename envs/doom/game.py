"""Building a ViZDoom game the way the trainer runs it: headless, no sound, no automap, only the screen the policy
sees, synchronous (the engine waits for each action), its engine behind `engine_guard.py`.

vizdoom is imported inside these functions, so `import envs` works without it (`pip install -e ".[doom]"`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from appo.envs.registry import EnvError

INSTALL_HINT = 'pip install -e ".[doom]"'
# Rendered at 160x120 (the smallest 4:3 mode) and resized for the policy (envs/doom/env.py).
SCREEN_RESOLUTION = "RES_160X120"
# Deathmatch rules for hosted games: respawn at once and far from the killer, no auto-aim, no crouching, and no
# cheats (the agent reads only its own state).
DEATHMATCH_ARGS = ("-deathmatch +sv_forcerespawn 1 +sv_noautoaim 1 +sv_respawnprotect 1 +sv_spawnfarthest 1 "
                   "+sv_nocrouch 1 +viz_respawn_delay 0 +viz_nocheat 1")


def import_vizdoom(env_name: str):
    try:
        import vizdoom
    except ImportError as exc:
        raise EnvError(f"--env={env_name}: needs vizdoom; install it with: {INSTALL_HINT}") from exc
    return vizdoom


def private_folder() -> Path:
    """This user's folder for the files the Doom envs keep to themselves (the engine wrapper, the port lock)."""
    folder = Path(tempfile.gettempdir()) / f"appo-doom-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


@cache
def engine_wrapper(real_engine: str) -> str:
    """An executable that ViZDoom starts instead of its engine: it execs `engine_guard.py` (this Python, isolated,
    no site-packages) with the controller's pid and the real engine, in a private folder. Written once per user,
    interpreter and engine."""
    guard = Path(__file__).with_name("engine_guard.py")
    folder = private_folder()
    # The engine writes its settings (_vizdoom.ini) into its working directory: this folder, not the user's.
    text = f'#!/bin/sh\ncd "{folder}" && exec "{sys.executable}" -I -S "{guard}" "$PPID" "{real_engine}" "$@"\n'
    path = folder / f"engine-{hashlib.sha1(text.encode()).hexdigest()[:12]}.sh"
    if not path.exists() or path.read_text() != text:
        partial = path.with_suffix(f".{os.getpid()}")
        partial.write_text(text)
        partial.chmod(0o700)
        partial.replace(path)  # atomic: another process may be starting a game at the same moment
    return str(path)


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that nothing holds right now (two calls made together may get the same one: take a
    host's port with `lease_port`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# Leased ports. A port is locked in one lock file (a one-byte `lockf` lock at offset = port, which the kernel drops
# when the process dies) against other processes, and kept in a set against this process's other games (lockf
# locks do not exclude their own process), under a thread lock (a worker's envs start their engines in threads).
_lease_lock = threading.Lock()
_lock_file: tuple[int, int] | None = None  # (pid, fd) of this process's handle on the port lock file
_ports_held: set[int] = set()


def _port_lock_fd() -> int:
    global _lock_file
    if _lock_file is None or _lock_file[0] != os.getpid():  # a forked child holds none of its parent's locks
        path = private_folder() / "ports.lock"
        _lock_file = (os.getpid(), os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        _ports_held.clear()
    return _lock_file[1]


def lease_port(attempts: int = 100) -> int:
    """A UDP port for a network game's host: free now, and held by no other game of this user on the machine (a
    single-agent game with bots or a match, in any process); give it back with `release_port`."""
    with _lease_lock:
        fd = _port_lock_fd()
        for _ in range(attempts):
            port = free_udp_port()
            if port in _ports_held:
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
            except OSError:  # another process's game holds it
                continue
            _ports_held.add(port)
            return port
    raise RuntimeError(f"no free UDP port for a Doom game after {attempts} tries")


def release_port(port: int) -> None:
    with _lease_lock:
        if port in _ports_held:
            _ports_held.discard(port)
            fcntl.lockf(_port_lock_fd(), fcntl.LOCK_UN, 1, port)


@dataclass(frozen=True)
class Network:
    """A multiplayer game: `players` > 0 hosts one for that many players on `port`; 0 joins the host at `port`."""

    port: int
    players: int = 0

    def game_args(self) -> str:
        if self.players:
            return f"-host {self.players} -port {self.port} {DEATHMATCH_ARGS}"
        return f"-join 127.0.0.1:{self.port}"


def new_game(env_name: str, cfg: str, buttons: list[str], variables: tuple[str, ...], *,
             episode_tics: int | None, network: Network | None = None, player_name: str = "agent") -> Any:
    """A configured `vizdoom.DoomGame`, not yet initialised (`game.init()` starts the engine)."""
    vzd = import_vizdoom(env_name)
    game = vzd.DoomGame()
    game.set_vizdoom_path(engine_wrapper(os.path.join(os.path.dirname(vzd.__file__), "vizdoom")))
    game.load_config(os.path.join(vzd.scenarios_path, cfg))
    game.set_window_visible(False)
    game.set_sound_enabled(False)
    game.set_audio_buffer_enabled(False)
    game.set_notifications_buffer_enabled(False)
    game.set_automap_buffer_enabled(False)
    game.set_depth_buffer_enabled(False)
    game.set_labels_buffer_enabled(False)
    game.set_objects_info_enabled(False)
    game.set_sectors_info_enabled(False)
    game.set_screen_resolution(getattr(vzd.ScreenResolution, SCREEN_RESOLUTION))
    game.set_screen_format(vzd.ScreenFormat.RGB24)
    game.set_mode(vzd.Mode.PLAYER)
    game.set_available_buttons([getattr(vzd.Button, name) for name in buttons])
    game.set_available_game_variables([getattr(vzd.GameVariable, name) for name in variables])
    if episode_tics is not None:
        game.set_episode_timeout(episode_tics)
    if network is not None:
        game.add_game_args(f"{network.game_args()} +name {player_name}")
    return game


@cache
def bot_roster() -> list[tuple[str, float]]:
    """Doom's built-in bots from the wheel's bots.cfg: (name, strength), strength the mean of the bot's aiming,
    perfection, reaction and isp (0-100)."""
    import vizdoom

    text = (Path(vizdoom.__file__).parent / "bots.cfg").read_text()
    roster = []
    for block in re.findall(r"\{([^}]*)\}", text):
        fields = dict(re.findall(r"^\s*(\w+)\s+(\S+)", block, re.MULTILINE))
        skills = [float(fields[key]) for key in ("aiming", "perfection", "reaction", "isp") if key in fields]
        roster.append((fields["name"], sum(skills) / max(len(skills), 1)))
    return roster


def bot_names(count: int, skill: float | None) -> list[str | None]:
    """Which bots to add: None each (Doom picks at random) without a `skill`; else the `count` bots whose strength
    is nearest to it (repeating the nearest when asked for more bots than bots.cfg has)."""
    if skill is None:
        return [None] * count
    ranked = sorted(bot_roster(), key=lambda bot: abs(bot[1] - skill))
    return [ranked[i % len(ranked)][0] for i in range(count)]


def add_bots(game: Any, names: list[str | None]) -> None:
    """Replace the game's bots with `names` (a fresh set each episode, as their frags restart with it)."""
    game.send_game_command("removebots")
    for name in names:
        game.send_game_command("addbot" if name is None else f"addbot {name}")


def cfg_buttons(env_name: str, cfg: str) -> list[str]:
    """The `available_buttons` a scenario's .cfg lists, in order (read without starting an engine)."""
    vzd = import_vizdoom(env_name)
    text = re.sub(r"#.*", "", Path(vzd.scenarios_path, cfg).read_text())
    block = re.search(r"available_buttons\s*=\s*\{([^}]*)\}", text)
    return block.group(1).split() if block else []


MAX_PLAYERS = 16


def opponent_frags(game: Any) -> float:
    """The most frags any other player of the match has (for the frag difference: in a duel, the opponent's).
    PLAYER_NUMBER counts from 0 and the PLAYER<i>_FRAGCOUNT slots from 1; slots past PLAYER_COUNT are empty."""
    import vizdoom as vzd

    me = int(game.get_game_variable(vzd.GameVariable.PLAYER_NUMBER)) + 1
    players = min(int(game.get_game_variable(vzd.GameVariable.PLAYER_COUNT)), MAX_PLAYERS)
    others = [game.get_game_variable(getattr(vzd.GameVariable, f"PLAYER{i}_FRAGCOUNT"))
              for i in range(1, players + 1) if i != me]
    return float(max(others, default=0.0))
