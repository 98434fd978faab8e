"""Doom matches between learning agents (envs/doom/multiplayer.py): stepping, per-agent rewards and stats, restarts of a
broken match, nothing left behind after close or kill -9; and the per-agent episode metrics of the actor's tracker.

Engines are checked per process tree (psutil), not with a machine-wide pgrep: other runs may host Doom meanwhile."""

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
from faster_fifo import Queue

from appo.config.cfg import parse_config
from appo.envs import EnvError, make_env
from appo.envs.doom import game, shaping
from appo.envs.doom.game import lease_port, release_port
from appo.envs.doom.multiplayer import DoomMatchEnv
from appo.memory.buffers import Layout, TrajBuffers
from appo.memory.control import SharedControl
from appo.sampling.episodes import EpisodeTracker
from appo.workers.context import Queues, WorkerContext
from tests.conftest import wait_for
from tests.test_resources import in_private_mount, needs_private_tmpfs

pytestmark = pytest.mark.timeout(120)
MATCH = {"num_agents": 2, "num_bots": 0}


def engines_under(pid: int) -> dict[int, str]:
    """The Doom engines below process `pid`: engine pid -> its game id (the suffix of its /dev/shm entries)."""
    found = {}
    for process in psutil.Process(pid).children(recursive=True):
        try:
            if process.name() == "vizdoom":
                args = process.cmdline()
                found[process.pid] = args[args.index("+viz_instance_id") + 1]
        except (psutil.Error, ValueError):
            pass
    return found


def assert_gone(pids: list[int], game_ids: list[str], within: float = 10.0) -> None:
    """Every process of `pids` ends and every /dev/shm entry of `game_ids` goes, within `within` seconds."""

    def alive() -> list[int]:
        return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]

    def shm() -> list[str]:
        return [name for name in os.listdir("/dev/shm") if any(name.endswith(g) for g in game_ids)]

    wait_for(lambda: not alive() and not shm(), within, "end of the game's processes and /dev/shm entries",
             details=lambda: f"left behind: processes {alive()}, /dev/shm {shm()}")


def play(env: DoomMatchEnv, steps: int) -> list:
    """`steps` random steps; returns each step's (rewards, terminated, truncated, info); every observation must
    fit the spaces (a dead player's health, -999900 in the engine, included)."""
    results = []
    for _ in range(steps):
        obs, rewards, terminated, truncated, info = env.step([env.action_space.sample() for _ in range(2)])
        assert all(env.observation_space.contains({key: value[j] for key, value in obs.items()}) for j in range(2))
        assert (obs["measurements"] >= 0).all()
        results.append((rewards, terminated, truncated, info))
    return results


def test_two_agent_match_steps_resets_and_reports_per_agent_stats():
    env = make_env("doom_multi_duel", {**MATCH, "episode_tics": 4 * 150, "reward_shaping": {"death": -0.5}})
    try:
        assert isinstance(env, DoomMatchEnv) and env.num_agents == 2 and env.episode_steps == 150
        assert env.get_reward_shaping() == {**shaping.DEFAULTS, "death": -0.5}
        assert env.get_reward_shaping_bounds() == shaping.BOUNDS
        obs, _ = env.reset(seed=0)
        assert obs["obs"].shape == (2, 3, 72, 128) and obs["obs"].dtype == np.uint8
        assert obs["measurements"].shape == (2, env.observation_space["measurements"].shape[0])
        assert env.observation_space["obs"].contains(obs["obs"][1])
        env.action_space.seed(0)
        for episode in range(2):
            results = play(env, 150)
            rewards = np.stack([r for r, *_ in results])
            assert rewards.shape == (150, 2) and rewards.dtype == np.float32 and np.isfinite(rewards).all()
            assert not any(terminated or truncated for _, terminated, truncated, _ in results[:-1])
            _, terminated, truncated, info = results[-1]
            assert truncated and not terminated and "match_restarted" not in info
            stats = info["episode_extra_stats"]
            assert len(stats) == 2 and all(set(s) == {"frags", "deaths", "frag_difference", "damage_dealt"}
                                           for s in stats)
            assert info["true_objective"] == [stats[0]["frags"], stats[1]["frags"]]
            # No bots: each agent's only opponent is the other agent.
            assert stats[0]["frag_difference"] == stats[0]["frags"] - stats[1]["frags"] == -stats[1]["frag_difference"]
            # The return is the shaped reward: frags, deaths (at this env's -0.5) and damage, plus pickups (>= 0).
            for j, agent in enumerate(stats):
                paid = agent["frags"] - 0.5 * agent["deaths"] + shaping.DEFAULTS["damage_dealt"] * agent["damage_dealt"]
                assert rewards[:, j].sum() >= paid - 1e-4
            if episode == 0:
                assert sum(s["deaths"] for s in stats) > 0, "random play in a duel dies (rockets) within 150 steps"
            obs, _ = env.reset()  # the match goes on: the next episode counts from here
            assert obs["obs"].shape == (2, 3, 72, 128)
        assert env.restarts == 0
    finally:
        env.close()


def test_a_match_needs_a_hosted_map_and_fitting_players():
    with pytest.raises(EnvError, match="hosted deathmatch map"):
        make_env("doom_basic", MATCH)
    with pytest.raises(EnvError, match="at most 2 players in all on that map"):
        make_env("doom_multi_duel", {"num_agents": 2, "num_bots": 1})


def test_a_killed_or_hung_player_restarts_the_match_and_play_goes_on():
    env = make_env("doom_multi_duel", {**MATCH, "step_timeout_s": 2.0})
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        play(env, 20)
        first = env.match
        pids = [player.process.pid for player in first.players]
        engines = engines_under(os.getpid())
        os.kill(pids[1], signal.SIGKILL)
        rewards, terminated, truncated, info = play(env, 1)[0]
        assert truncated and not terminated and info == {"match_restarted": True} and not rewards.any()
        assert env.match is None and env.restarts == 1
        assert_gone(pids + list(engines), list(engines.values()))
        env.reset()
        assert env.match.port != first.port and not set(engines_under(os.getpid())) & set(engines)
        assert not any(truncated for _, _, truncated, _ in play(env, 30))
        # A seat that stops answering (here: stopped) is a timeout: the match restarts after step_timeout_s.
        os.kill(env.match.players[0].process.pid, signal.SIGSTOP)
        started = time.monotonic()
        _, _, truncated, info = play(env, 1)[0]
        assert truncated and info["match_restarted"] and 2.0 <= time.monotonic() - started < 8.0
        env.reset()
        assert not any(truncated for _, _, truncated, _ in play(env, 30)) and env.restarts == 2
    finally:
        env.close()


def test_close_leaves_no_player_engine_or_shm():
    env = make_env("doom_cig", {"num_agents": 2, "num_bots": 1, "episode_tics": 400})
    env.reset()
    play(env, 10)
    pids = [player.process.pid for player in env.match.players]
    engines = engines_under(os.getpid())
    assert len(engines) == 2
    env.close()
    assert_gone(pids + list(engines), list(engines.values()), within=1.0)  # close() waits for them


@pytest.mark.slow
def test_kill_9_of_the_owner_leaves_no_player_engine_or_shm():
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        from appo.envs import make_env
        env = make_env("doom_multi_duel", {"num_agents": 2, "num_bots": 0})
        env.reset()
        for _ in range(20):
            env.step([env.action_space.sample() for _ in range(2)])
        print("ready", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "ready"
        under = [process.pid for process in psutil.Process(owner.pid).children(recursive=True)]
        engines = engines_under(owner.pid)
        assert len(engines) == 2 and len(under) >= 6  # 2 players, each with its engine guard and engine
        os.kill(owner.pid, signal.SIGKILL)
    finally:
        owner.kill()
        owner.wait()
    assert_gone(under, list(engines.values()))


@pytest.mark.slow
def test_ports_are_leased_once_across_processes(monkeypatch):
    held = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        from appo.envs.doom import game
        game.free_udp_port = lambda: 40123
        print(game.lease_port(), flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline().strip() == "40123"
        offers = iter([40123, 40123, 40124, 40124, 40125])
        monkeypatch.setattr(game, "free_udp_port", lambda: next(offers))
        first = lease_port()  # 40123 is another process's: refused
        second = lease_port()  # 40124 is this process's already: refused
        assert (first, second) == (40124, 40125)
        release_port(first)
        release_port(second)
    finally:
        held.kill()
        held.wait()
    monkeypatch.setattr(game, "free_udp_port", lambda: 40123)
    assert lease_port() == 40123  # the kernel dropped the dead process's lock
    release_port(40123)


def test_ports_leased_together_by_threads_differ(monkeypatch):
    """A worker's envs start their engines in threads at once, and probes made together may find the same free
    port: offered one port first, each of 8 threads leasing at the same moment gets a port of its own."""
    real_free_udp_port = game.free_udp_port
    offers = [real_free_udp_port()] * 8
    monkeypatch.setattr(game, "free_udp_port", lambda: offers.pop() if offers else real_free_udp_port())
    together = threading.Barrier(8)

    def lease(_) -> int:
        together.wait(timeout=10)
        return lease_port()

    with ThreadPoolExecutor(8) as pool:
        ports = list(pool.map(lease, range(8)))
    for port in ports:
        release_port(port)
    assert len(set(ports)) == 8, ports


def tracker_for_two_agents(policies: int = 1) -> tuple[EpisodeTracker, object]:
    """An actor's episode tracker over real buffers, for one 2-agent duel env per split."""
    cfg = parse_config(["--env=duel", "--num_workers=1", "--num_envs_per_worker=2", "--worker_num_splits=2",
                        "--rollout=4", "--batch_size=16", f"--num_policies={policies}"])
    env = make_env("duel")
    layout = Layout.from_cfg(cfg, env.observation_space, env.action_space, num_agents=2)
    queues = Queues(report=Queue(), learner_inboxes=[Queue()], actor_inboxes=[Queue()],
                    inference_wakeups=[[Queue()]])
    ctx = WorkerContext(cfg, layout, (env.observation_space, env.action_space), TrajBuffers(layout),
                        SharedControl(layout, cfg.num_policies, shaping_keys=()), queues, weights_names=[])
    return EpisodeTracker(ctx, 0), env


def test_tracker_takes_per_agent_episode_stats_and_keeps_the_dict_form():
    tracker, env = tracker_for_two_agents()
    slots = np.arange(2)
    tracker.add_rewards(0, [1.0, -1.0])
    per_agent = {"episode_extra_stats": [{"frags": 3, "deaths": 1}, {"frags": 1, "deaths": 3}],
                 "true_objective": [3.0, 1.0]}
    tracker.end_episode(0, 0, env, per_agent, slots, 0)
    tracker.add_rewards(0, [2.0, 0.5])
    tracker.end_episode(0, 0, env, {"episode_extra_stats": {"score_0": 2, "score_1": 0}}, slots, 0)
    episodes, _, _ = tracker.take()
    assert [(e.reward, e.objective, e.extra) for e in episodes] == [
        (1.0, 3.0, {"frags": 3.0, "deaths": 1.0}), (-1.0, 1.0, {"frags": 1.0, "deaths": 3.0}),
        (2.0, 2.0, {"score_0": 2.0, "score_1": 0.0}), (0.5, 0.5, {"score_0": 2.0, "score_1": 0.0})]


def test_a_game_is_won_on_the_per_agent_true_objective_and_else_on_the_return():
    tracker, env = tracker_for_two_agents(policies=2)
    tracker.agent_policy[0][:] = [0, 1]
    slots = np.arange(2)
    tracker.add_rewards(0, [5.0, 1.0])  # p0 picked up more (shaped return) but p1 fragged more
    tracker.end_episode(0, 0, env, {"true_objective": [1.0, 2.0]}, slots, 0)
    tracker.add_rewards(0, [5.0, 1.0])
    tracker.end_episode(0, 0, env, {"true_objective": 7.0}, slots, 0)  # one value for both: the returns decide
    _, games, _ = tracker.take()
    assert [(game.players, game.scores) for game in games] == [(["p0", "p1"], [1.0, 2.0]), (["p0", "p1"], [5.0, 1.0])]


@pytest.mark.slow
def test_a_host_that_cannot_bind_its_port_is_started_again_on_another(monkeypatch):
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a program outside the trainer holds the port
    taken.bind(("127.0.0.1", 0))
    offers = itertools.chain([taken.getsockname()[1]], iter(game.free_udp_port, None))
    monkeypatch.setattr(game, "free_udp_port", lambda: next(offers))
    env = make_env("doom_multi_duel", MATCH)
    try:
        assert env.match.port == taken.getsockname()[1]
        env.reset()
        assert env.match.port != taken.getsockname()[1]
        assert not any(truncated for _, _, truncated, _ in play(env, 10))
    finally:
        env.close()
        taken.close()


@pytest.mark.slow
@needs_private_tmpfs
@pytest.mark.timeout(120)
def test_a_match_run_whose_engines_the_shared_memory_cannot_hold_is_refused_at_start(tmp_path):
    """8 duels are 16 engines of 128 KB of /dev/shm each: with the weights (about 8 MB at the defaults) they do not
    fit in 9 MB, though the weights alone do. The run is refused in one line (exit code 2) before its workers
    start; the env probed for its spaces leaves nothing behind and the experiment dir is not made."""
    result = in_private_mount(
        f"mount -t tmpfs -o size=9m tmpfs /dev/shm && {sys.executable} -m appo.train --env=doom_multi_duel "
        f"--env_kwargs='{json.dumps(MATCH)}' --num_workers=1 --num_envs_per_worker=8 --train_for_seconds=5 "
        f"--experiment=refused --train_dir={tmp_path}; echo exit=$? left=$(ls /dev/shm)", timeout=100)
    assert result.stdout.rstrip().endswith("exit=2 left="), result.stdout[-3000:] + result.stderr[-3000:]
    assert not (tmp_path / "refused").exists() and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    refused = re.fullmatch(r"error: /dev/shm is too small for this run: 1 weights segment \(one per policy and "
                           r"self-play snapshot, ([\d.]+) MB each\) and 8 envs \(256 KB each[^)]*\) need [\d.]+ MB, "
                           r"/dev/shm has [\d.]+ MB free: .*--shm-size.*", line)
    assert refused, line
    assert float(refused.group(1)) < 9, "the weights alone must fit for this test to be about the engines"
