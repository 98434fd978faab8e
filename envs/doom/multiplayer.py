"""`DoomMatchEnv`: N learning agents in one Doom deathmatch (multi_duel, cig, multi_deathmatch), a multi-agent env.

    python -m appo.train --env=doom_multi_duel --env_kwargs='{"num_agents": 2, "num_bots": 0}'

Each agent has the observation and action spaces DoomEnv has on that map and the shaped reward of
envs/doom/shaping.py (one scheme for the whole match: `set_reward_shaping`); a dead player respawns at once (the
host's `+sv_forcerespawn 1 +viz_respawn_delay 0`). Built-in bots (`num_bots`, `bot_skill`) join at the match's start.

Episodes. The match is one continuous deathmatch: an episode is `episode_tics` of it (the map's timeout by default),
ended as truncated, and the next episode goes on from there (the trainer bootstraps the value at a truncation). The
engines' own episode end and `new_episode()` are not used: in a network game the seats reach them at different
steps, and the host reads HEALTH -999900 after one. The last step's info has, as lists with one entry per agent,
`episode_extra_stats` (frags, deaths, frag difference against the best other player, agents and bots, in this
episode; damage dealt) and `true_objective` (frags). A `seed` given to reset is not passed to the engines.

How a match runs. A ViZDoom network game needs one engine per player. Two such games in threads of one process
deadlock, and a host whose peer died waits forever inside `make_action`, so every player's game runs in its own
process, `python -m appo.envs.doom.multiplayer`, started with `subprocess` (actor workers are daemons and may not have
multiprocessing children). Seat 0 hosts (`-host N`), the others join it on 127.0.0.1. The env process only relays:
it writes every seat's command to its pipe, then reads every seat's reply with a deadline, so no engine can block
it. Seats advance in lockstep one tic at a time (a step is `frame_skip` exchanges; only the last renders and
replies with the screen and game variables): several tics per exchange (`make_action(action, 4)`) deadlock ViZDoom's
synchronous network game within a few hundred steps (ViZDoom issue #391; seen here too).

- Ports: a port is leased for the match's life (`game.lease_port`: free now, and held by no other game of this user
  on the machine, a match's or a single-agent game's with bots). A host that still cannot bind (a program outside
  the trainer took the port meanwhile) fails its init: the match starts again on a new port, up to START_ATTEMPTS
  times, then the reset raises.
- Failures: a player process that exits (an engine crash, a failed init) or a seat that answers no exchange within
  `step_timeout_s` (hung, desynced) ends the match: every player process is killed, the step returns the episode as
  truncated with `info["match_restarted"] = True` and zero rewards (one log line), and the next reset starts a new
  match.
- Nothing is left behind: `close()` closes the pipes (the players close their games and exit), kills what has not
  exited after CLOSE_TIMEOUT_S and waits for the engines. A player process is SIGKILLed when the process that started
  it dies (PR_SET_PDEATHSIG), and its engine, behind envs/doom/engine_guard.py, then dies too and its /dev/shm
  entries go. Linux sends that signal when the *thread* that started the player ends: make and step the env from
  one long-lived thread (the trainer does).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

from appo.envs.doom import shaping
from appo.envs.doom.actions import FULL_BUTTONS, ActionSet
from appo.envs.doom.env import (
    DEATHMATCH_MEASUREMENTS,
    FRAME_SKIP,
    OBS_HEIGHT,
    OBS_WIDTH,
    SHM_BYTES_PER_GAME,
    screen_observation,
)
from appo.envs.doom.game import MAX_PLAYERS, bot_names, lease_port, release_port
from appo.envs.doom.scenarios import Scenario
from appo.envs.registry import EnvError
from appo.utils.logs import log

STEP_TIMEOUT_S = 10.0  # a seat that answers a step later than this has hung or desynced: the match is restarted
START_TIMEOUT_S = 15.0  # engines start and connect (1-3 s on an idle machine); 3 tries stay within a minute
START_ATTEMPTS = 3
DEFAULT_EPISODE_TICS = 4200  # 2 minutes of game time, for a map whose Scenario sets no timeout
# Most players (agents and bots) a network game on a map takes: more crash the engine (signal 11; vizdoom 1.3.2).
MATCH_PLAYER_LIMITS = {"multi_duel.cfg": 2}
PICKUPS = slice(shaping.COUNTERS.index("HEALTH"), None)  # what a respawn refills: health, armour, ammo, weapons
CLOSE_TIMEOUT_S = 5.0
# Commands: OBSERVE (reply with the state now), TIC (one tic of the action, no state: a 1-byte reply), STEP (its last
# tic, reply with the state). The command pipe's end-of-file tells a player to close its game and exit.
OBSERVE, TIC, STEP = 1, 2, 3


class MatchBroken(Exception):
    """A seat's process died or it did not answer in time: the match must be started again."""


# ---------------------------------------------------------------- what crosses the pipes
@dataclass(frozen=True)
class SeatSpec:
    """What a player process needs to build its game (sent as JSON on its command line)."""

    env_name: str
    cfg: str
    variables: tuple[str, ...]
    port: int
    num_agents: int
    seat: int  # 0 hosts the game (and adds the bots), the others join it
    bots: tuple[str | None, ...]
    parent_pid: int
    command_fd: int
    reply_fd: int


def command_size(num_choices: int) -> int:
    """A command is int64s: [OBSERVE, TIC or STEP, whether to read the others' frags (0/1), the action's choices]."""
    return 8 * (2 + num_choices)


def reply_dtype(num_variables: int) -> np.dtype:
    """One seat's reply: its player slot (0-based PLAYER_NUMBER), its game variables and screen now, and from the
    host when asked (an episode's first and last step) every slot's frags (PLAYER1_FRAGCOUNT ...), bots' included:
    a joining game does not see the others' frags (it reads 0)."""
    return np.dtype([("slot", "<f8"), ("frags", "<f8", (MAX_PLAYERS,)), ("variables", "<f8", (num_variables,)),
                     ("screen", "u1", (3, OBS_HEIGHT, OBS_WIDTH))])


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, buffer: np.ndarray) -> bool:
    """Fill `buffer` (uint8) from a blocking fd; False at end-of-file."""
    got = 0
    while got < buffer.size:
        n = os.readv(fd, [buffer[got:]])
        if n == 0:
            return False
        got += n
    return True


# ---------------------------------------------------------------- the env process's side
class PlayerProcess:
    """One seat: the subprocess that owns its game, and the pipes to it."""

    def __init__(self, spec: SeatSpec):
        command_read, self.command_fd = os.pipe()
        self.reply_fd, reply_write = os.pipe()
        spec = replace(spec, command_fd=command_read, reply_fd=reply_write)
        try:
            # The engine's console goes to /dev/null (it prints every connection step); Python errors to stderr.
            self.process = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(asdict(spec))],
                                            pass_fds=(command_read, reply_write), stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL)
        finally:
            os.close(command_read)
            os.close(reply_write)

    def send(self, command: bytes) -> None:
        try:
            _write_all(self.command_fd, command)
        except BrokenPipeError:
            raise MatchBroken(f"player process {self.process.pid} {self.exit_text()}") from None

    def exit_text(self, wait_s: float = 0.0) -> str:
        try:
            return f"exited with code {self.process.wait(wait_s)}"
        except subprocess.TimeoutExpired:
            return "is running"

    def close(self, kill: bool) -> list:
        """Ask the player to close its game (or kill it at once: `kill`); returns the processes under it (its
        engine guard and engine), for the caller to wait on."""
        try:
            under = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            under = []
        for fd in (self.command_fd, self.reply_fd):
            os.close(fd)
        if kill:
            self.process.kill()
        return under

    def wait(self, until: float) -> None:
        try:
            self.process.wait(timeout=max(until - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Match:
    """The player processes of one match on one leased port, and the lockstep exchange with them."""

    def __init__(self, spec: SeatSpec, reply: np.dtype):
        self.port = lease_port()
        self.players: list[PlayerProcess] = []
        self.closed = False
        try:
            for seat in range(spec.num_agents):
                self.players.append(PlayerProcess(replace(spec, port=self.port, seat=seat)))
        except BaseException:
            self.close(kill=True)
            raise
        self.replies = np.zeros(spec.num_agents, dtype=reply)
        self._reply_bytes = self.replies.view(np.uint8).reshape(spec.num_agents, reply.itemsize)
        self._acks = np.zeros((spec.num_agents, 1), np.uint8)
        self._seat_of_fd = {player.reply_fd: seat for seat, player in enumerate(self.players)}
        self.started = False  # a first exchange went through: the engines are up and connected

    def exchange(self, commands: np.ndarray, timeout: float) -> np.ndarray:
        """Send each seat its command (a row of `commands`), then wait for every reply (at most `timeout` seconds).
        Returns the replies (overwritten by the next exchange; after TIC commands, only acknowledgements)."""
        for player, command in zip(self.players, commands):
            player.send(command.tobytes())
        target = self._acks if commands[0, 0] == TIC else self._reply_bytes
        size = target.shape[1]
        deadline = time.monotonic() + timeout
        got = dict.fromkeys(self._seat_of_fd, 0)
        poller = select.poll()
        for fd in got:
            poller.register(fd, select.POLLIN)
        while got:
            left = deadline - time.monotonic()
            events = poller.poll(max(left, 0.0) * 1000.0) if left > 0 else []
            if not events:
                waiting = sorted(self._seat_of_fd[fd] for fd in got)
                raise MatchBroken(f"seats {waiting} did not answer within {timeout:.0f} s")
            for fd, _ in events:
                seat = self._seat_of_fd[fd]
                n = os.readv(fd, [target[seat, got[fd]:]])
                if n == 0:
                    raise MatchBroken(f"the player process of seat {seat} {self.players[seat].exit_text(1.0)}")
                got[fd] += n
                if got[fd] == size:
                    del got[fd]
                    poller.unregister(fd)
        return self.replies

    def close(self, kill: bool = False) -> None:
        """End every player process (`kill`: at once, for a broken match) and wait until their engines are gone."""
        if self.closed:
            return
        self.closed = True
        under = [process for player in self.players for process in player.close(kill)]
        until = time.monotonic() + CLOSE_TIMEOUT_S
        for player in self.players:
            player.wait(until)
        _, alive = psutil.wait_procs(under, timeout=max(until - time.monotonic(), 0.1))
        for process in alive:  # an engine guard that has not finished: it removes the engine's /dev/shm entries
            log.warning("Doom match on port %d: process %d outlived its player by %.0f s", self.port, process.pid,
                        CLOSE_TIMEOUT_S)
        release_port(self.port)


class DoomMatchEnv(shaping.ShapedReward, gym.Env):
    """`num_agents` learning agents (and `num_bots` built-in bots) in one deathmatch; see the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 35}

    def __init__(self, name: str, scenario: Scenario, num_agents: int = 2, num_bots: int = 0,
                 bot_skill: float | None = None, frame_skip: int = FRAME_SKIP, episode_tics: int | None = None,
                 reward_shaping: dict[str, float] | None = None, step_timeout_s: float = STEP_TIMEOUT_S,
                 render_mode: str | None = None):
        if not scenario.bots:
            raise EnvError(f"--env={name}: num_agents > 1 needs a hosted deathmatch map (doom_multi_duel, doom_cig, "
                           "doom_multi_deathmatch)")
        most = MATCH_PLAYER_LIMITS.get(scenario.cfg, MAX_PLAYERS)
        if num_agents < 2 or num_bots < 0 or num_agents + num_bots > most:
            raise EnvError(f"--env_kwargs for {name}: num_agents={num_agents}, num_bots={num_bots}: need 2 or more "
                           f"agents and at most {most} players in all on that map")
        if frame_skip < 1 or step_timeout_s <= 0:
            raise ValueError(f"frame_skip={frame_skip}, step_timeout_s={step_timeout_s}: must be positive")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r}: only 'rgb_array' (or None)")
        self.name, self.num_agents, self.render_mode = name, int(num_agents), render_mode
        # For the start-up /dev/shm check: one engine per agent (the bots play inside the host's engine).
        self.shm_bytes_per_env = self.num_agents * SHM_BYTES_PER_GAME
        self.frames_per_step, self.step_timeout_s = frame_skip, step_timeout_s
        self._scales = np.array(list(DEATHMATCH_MEASUREMENTS.values()), dtype=np.float32)
        variables, self._counter_index = shaping.with_counters(tuple(DEATHMATCH_MEASUREMENTS))
        self.actions = ActionSet(FULL_BUTTONS)
        self.action_space = self.actions.space
        self.observation_space = gym.spaces.Dict({
            "obs": gym.spaces.Box(0, 255, (3, OBS_HEIGHT, OBS_WIDTH), np.uint8),
            "measurements": gym.spaces.Box(-np.inf, np.inf, (len(self._scales),), np.float32)})
        self.shaping = dict(shaping.DEFAULTS, **(reward_shaping or {}))
        self._players = num_agents + num_bots  # they fill slots 0 .. players - 1
        self.episode_steps = max(1, (episode_tics or scenario.timeout_tics or DEFAULT_EPISODE_TICS) // frame_skip)
        self._spec = SeatSpec(env_name=name, cfg=scenario.cfg, variables=variables, port=0, num_agents=self.num_agents,
                              seat=0, bots=tuple(bot_names(num_bots, bot_skill)), parent_pid=os.getpid(),
                              command_fd=-1, reply_fd=-1)  # port, seat and pipes are set per match and seat
        self._reply = reply_dtype(len(variables))
        self._commands = np.zeros((self.num_agents, command_size(len(self.action_space.nvec)) // 8), np.int64)
        self._obs: dict[str, np.ndarray] | None = None
        self._t = 0  # steps into the episode
        self.restarts = 0
        self.match: Match | None = Match(self._spec, self._reply)  # the engines start now; the first reset waits

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """The next episode: the running match goes on (its counters are the new episode's base), or a new match
        starts when there is none (the first reset, or after a restart)."""
        super().reset(seed=seed)
        self._t = 0
        if self.match is not None and self.match.started:
            self._episode_start, self._frags_start = self._counters, self._frags_now
            return self._obs, {}
        self._commands[:] = 0
        self._commands[:, :2] = OBSERVE, 1
        for attempt in range(1, START_ATTEMPTS + 1):
            if self.match is None:
                self.match = Match(self._spec, self._reply)
            try:
                replies = self.match.exchange(self._commands, START_TIMEOUT_S)
                self.match.started = True
                break
            except MatchBroken as exc:
                self._end_match(f"could not start (attempt {attempt} of {START_ATTEMPTS}): {exc}")
                if attempt == START_ATTEMPTS:
                    raise RuntimeError(f"{self.name}: the Doom match did not start: {exc}") from exc
        self._counters = self._episode_start = replies["variables"][:, self._counter_index]
        self._slots = replies["slot"].astype(np.int64)
        self._frags_now = self._frags_start = replies["frags"][0, :self._players].copy()
        return self._observe(replies), {}

    def step(self, actions):
        self._t += 1
        last = self._t >= self.episode_steps
        self._commands[:, 2:] = np.asarray(actions, dtype=np.int64).reshape(self.num_agents, -1)
        try:
            # One exchange per tic (see the module docstring): every seat makes tic k before any makes tic k + 1.
            self._commands[:, :2] = TIC, 0
            for _ in range(self.frames_per_step - 1):
                self.match.exchange(self._commands, self.step_timeout_s)
            self._commands[:, :2] = STEP, last
            replies = self.match.exchange(self._commands, self.step_timeout_s)
        except MatchBroken as exc:
            self.restarts += 1
            self._end_match(f"broke, a new match starts at the next reset ({self.restarts} so far here): {exc}")
            return self._obs, np.zeros(self.num_agents, np.float32), False, True, {"match_restarted": True}
        obs = self._observe(replies)
        counters = replies["variables"][:, self._counter_index]
        before = self._counters.copy()
        # A player dead when the step began (its HEALTH reads -999900 in a network game) has respawned since, or
        # is still dead: what it holds now is a respawn's, not pickups.
        dead = before[:, PICKUPS.start] <= 0
        before[dead, PICKUPS] = counters[dead, PICKUPS]
        rewards = np.array([shaping.shaped_reward(start, end, self.shaping) for start, end in zip(before, counters)],
                           dtype=np.float32)
        self._counters = counters
        if not last:
            return obs, rewards, False, False, {}
        self._frags_now = replies["frags"][0, :self._players].copy()
        made = self._frags_now - self._frags_start  # this episode's frags of every slot (agents and bots)
        stats = [shaping.match_stats(start, now, float(made[np.arange(len(made)) != slot].max()))
                 for start, now, slot in zip(self._episode_start, counters, self._slots)]
        return obs, rewards, False, True, {"episode_extra_stats": stats,
                                           "true_objective": [agent["frags"] for agent in stats]}

    def _observe(self, replies: np.ndarray) -> dict[str, np.ndarray]:
        measurements = (np.maximum(replies["variables"][:, :len(self._scales)], 0.0) / self._scales).astype(np.float32)
        self._obs = {"obs": replies["screen"].copy(), "measurements": measurements}
        return self._obs

    def _end_match(self, why: str) -> None:
        log.warning("%s: Doom match on port %d %s", self.name, self.match.port, why)
        self.match.close(kill=True)
        self.match = None

    def render(self) -> np.ndarray | None:
        """Agent 0's last screen, as the policy sees it (128x72 RGB, height x width x 3)."""
        if self.render_mode != "rgb_array" or self._obs is None:
            return None
        return np.ascontiguousarray(self._obs["obs"][0].transpose(1, 2, 0))

    def close(self) -> None:
        if self.match is not None:
            self.match.close()
            self.match = None


# ---------------------------------------------------------------- the player process's side
def serve_seat(spec: SeatSpec) -> int:
    """A player process: build and start this seat's game, then answer commands until the command pipe closes."""
    import vizdoom

    from appo.envs.doom.game import Network, add_bots, new_game
    from appo.utils.process import die_with_parent

    die_with_parent(spec.parent_pid, f"doom_seat{spec.seat}")
    for fd in (spec.command_fd, spec.reply_fd):
        os.set_inheritable(fd, False)  # the engine must not hold the pipes open after this process dies
    # The engine prints every step of the network handshake on stderr: it gets /dev/null, Python keeps stderr.
    sys.stderr = open(os.dup(2), "w", buffering=1)  # noqa: SIM115 (this process's stderr until it exits)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    network = Network(spec.port, spec.num_agents if spec.seat == 0 else 0)
    game = new_game(spec.env_name, spec.cfg, list(FULL_BUTTONS), spec.variables, episode_tics=0,
                    network=network, player_name=f"agent{spec.seat}")
    game.init()
    if spec.seat == 0:
        add_bots(game, list(spec.bots))
    slot_frags = [getattr(vizdoom.GameVariable, f"PLAYER{i}_FRAGCOUNT") for i in range(1, MAX_PLAYERS + 1)]
    actions = ActionSet(FULL_BUTTONS)
    reply = np.zeros((), dtype=reply_dtype(len(spec.variables)))
    reply["slot"] = game.get_game_variable(vizdoom.GameVariable.PLAYER_NUMBER)
    command = np.zeros(command_size(len(actions.space.nvec)) // 8, np.int64)
    try:
        while _read_exactly(spec.command_fd, command.view(np.uint8)):
            if command[0] != OBSERVE:
                game.set_action(actions.to_buttons(command[2:]))
                game.advance_action(1, command[0] == STEP)  # the state (and the screen) only after a step's last tic
            if command[0] == TIC:
                _write_all(spec.reply_fd, b"\0")
                continue
            state = game.get_state()
            if state is None:  # the game ended (it has no time limit): the match is broken
                return 1
            reply["screen"] = screen_observation(state.screen_buffer)
            reply["variables"] = state.game_variables
            if command[1] and spec.seat == 0:
                reply["frags"] = [game.get_game_variable(variable) for variable in slot_frags]
            _write_all(spec.reply_fd, reply.tobytes())
    finally:
        game.close()
    return 0


if __name__ == "__main__":
    fields = json.loads(sys.argv[1])
    sys.exit(serve_seat(SeatSpec(**{**fields, "variables": tuple(fields["variables"]), "bots": tuple(fields["bots"])})))
