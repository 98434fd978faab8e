"""Actor (rollout) worker: steps `--num_envs_per_worker` envs in `--worker_num_splits` groups.

Each split writes observations straight into its trajectory slots, asks the inference worker of each
policy acting in it for actions (by bumping a request counter in shared memory), and steps again when
the answer counters catch up; meanwhile the other splits step (double buffering). Queue messages are
only needed to wake a process that sleeps: an idle inference worker, or this actor when no split can
step. After `--rollout` steps the filled slots go to the learners (`SharedControl.slot_owed`) and the split
moves onto slots no learner owes a read. All of this worker's state that others depend on lives in
shared memory, so a replacement started by the runner after a crash carries on in the same buffers.
This module never imports torch: it sees the shared buffers as numpy arrays.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import traceback

import gymnasium as gym
import numpy as np
from faster_fifo import Empty, Full

from appo.config.cfg import env_kwargs
from appo.config.topology import inference_shard_of, lockstep, trajectories_per_iteration
from appo.memory.buffers import TERMINATED, TRUNCATED, WAKE_TIMEOUT_S, Layout, TrajBuffers
from appo.memory.control import MAKE, NO_CALL, RESET, STEP, SharedControl
from appo.population.matchmaking import Matchmaker, acting_name, learning_policy, num_acting_ids
from appo.spaces import SINGLE_KEY, to_env_action
from envs import make_env
from utils.logs import log
from utils.process import init_worker
from utils.timing import Timing

REPORT_INTERVAL_S = 1.0



def extra_stats(info: dict) -> dict[str, float]:
    """An env's own episode metrics: the numeric values of `info["episode_extra_stats"]` (a dict) at the end of
    an episode; they are averaged per policy like the reward and written to tensorboard (episode_extra/)."""
    extra = info.get("episode_extra_stats")
    if not isinstance(extra, dict):
        return {}
    return {str(k): float(v) for k, v in extra.items() if isinstance(v, (int, float, np.number)) and math.isfinite(v)}


class Split:
    """One group of envs that step together; `t` is the step index inside the current trajectory.

    Agent j of the split is agent j % num_agents of env j // num_agents.
    """

    def __init__(self, envs: list[gym.Env], num_agents: int):
        self.envs = envs
        self.t = 0
        self.acting: list[int] = []  # policies asked for actions at the last request
        n = len(envs) * num_agents
        self.slots = np.zeros(n, dtype=np.int64)  # a copy of SharedControl.cur_slot for this split
        # Per env-agent views of its slot's observation rows [T+1, ...] (single Box observations only).
        self.obs_rows: list[np.ndarray] = []
        self.steps = 0  # steps this split made; an episode's length is steps - episode_start
        self.episode_reward = [0.0] * n
        self.episode_start = [0] * n


class ActorWorker:
    def __init__(self, cfg, layout: Layout, worker: int, traj: TrajBuffers, control: SharedControl,
                 inbox, inference_queues: list[list], learner_inboxes: list, report_queue):
        """`inference_queues[group][index]`: wake-up queues of the inference workers (cfg.inference_shards)."""
        self.cfg, self.layout, self.worker = cfg, layout, worker
        self.num_agents = layout.num_agents
        self.envs_per_split = layout.agents_per_split // layout.num_agents
        self.env_kwargs = env_kwargs(cfg)
        self.traj, self.control = traj, control
        self.inbox = inbox
        # This worker is served by inference worker `worker % policy_workers_per_policy` of each policy.
        self.inference_index = worker % cfg.policy_workers_per_policy
        self.inference_queues = [queues[self.inference_index] for queues in inference_queues]  # per group
        self.inference_group = inference_shard_of(cfg)  # per policy
        self.requested = control.actors.request_count[:, worker]  # [policy, split] views
        self.answered = control.inference.answer_count[:, worker]
        self.learner_inboxes, self.report_queue = learner_inboxes, report_queue
        self.rng = np.random.default_rng(None if cfg.seed is None else cfg.seed + 1000 * worker)
        self.slot_range = layout.worker_slots(worker)
        self.in_use = np.zeros(len(self.slot_range), dtype=bool)  # slots a split of this worker is filling
        self.timing = Timing()
        self.env_steps = 0
        self.env_errors = 0
        self.errors_seen: set[str] = set()  # distinct env errors already logged with their traceback
        self.nonfinite_rewards = 0
        self.nonfinite_reported: set[tuple[int, int]] = set()  # (split, env) already reported
        # What this worker is inside (appo/memory/control.py, ENV_CALLS), for the runner's hang detection.
        self.call, self.call_env, self.call_since = control.actors.call, control.actors.call_env, control.actors.call_since
        # (policy, return, length, PBT objective or None, extra_stats) of the episodes finished since the last report
        self.finished_episodes: list[tuple[int, float, int, float | None, dict[str, float]]] = []
        # Multi-agent envs played by more than one acting id: (players' names, their returns) per game, for ratings.
        self.finished_games: list[tuple[list[str], list[float]]] = []
        self.num_acting = num_acting_ids(cfg)  # policies and self-play snapshots (appo/population/matchmaking.py)
        self.matchmaker = Matchmaker(cfg, layout.num_agents, control.learners.policy_version, self.rng)
        self.splits: list[Split] = []
        self.last_report = time.monotonic()
        self.lockstep = lockstep(cfg)
        self.trajs_sent = 0
        self.base_version = 0
        self.action_space: gym.Space | None = None
        self.plain_discrete = False
        self.single_obs: np.ndarray | None = None  # traj.obs' only array, when that is all the env observes
        # Reward-shaping coefficients PBT sets per policy (control.runner.reward_shaping); none without PBT.
        self.shaping_keys = control.runner.shaping_keys if cfg.with_pbt else ()

    # ---------------------------------------------------------------- set-up
    def _env_seed(self, split: int, index: int) -> int | None:
        if self.cfg.seed is None:
            return None
        return self.cfg.seed + (self.worker * self.layout.num_splits + split) * self.layout.agents_per_split + index

    def _random_actions(self, env: gym.Env):
        if self.num_agents == 1:
            return env.action_space.sample()
        return np.stack([env.action_space.sample() for _ in range(self.num_agents)])

    def _first_obs(self, split: int, index: int, env: gym.Env) -> np.ndarray:
        obs, _ = env.reset(seed=self._env_seed(split, index))
        if self.cfg.decorrelate_envs_on_one_worker:
            max_steps = (env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 1000)
            env.action_space.seed(int(self.rng.integers(2**31)))
            for _ in range(int(self.rng.integers(0, max_steps // 2 + 1))):
                obs, _, terminated, truncated, _ = env.step(self._random_actions(env))
                if terminated or truncated:
                    obs, _ = env.reset()
                    break
        return obs

    def _calling(self, call: int, env: int) -> None:
        """Record that this worker enters an env call (NO_CALL: left it), for the runner's hang detection;
        `env` counts the worker's envs across splits. The call is written last, after its time and env."""
        w = self.worker
        self.call_since[w] = time.monotonic()
        self.call_env[w] = env
        self.call[w] = call

    def _make_env(self, s: int, i: int) -> gym.Env:
        self._calling(MAKE, s * self.envs_per_split + i)
        return make_env(self.cfg.env, self.env_kwargs)

    def init_envs(self) -> None:
        traj, agents, a = self.traj, self.layout.agents_per_split, self.num_agents
        self.control.actors.waiting[self.worker] = 0  # a predecessor that crashed may have left it raised
        self.splits = [Split([self._make_env(s, i) for i in range(agents // a)], a)
                       for s in range(self.layout.num_splits)]
        first = self.splits[0].envs[0]
        self.action_space = first.action_space
        # Fast paths for the common case: one agent, a plain Discrete action, a single Box observation.
        self.plain_discrete = a == 1 and isinstance(self.action_space, gym.spaces.Discrete)
        self.single_obs = traj.obs[SINGLE_KEY] if a == 1 and isinstance(first.observation_space, gym.spaces.Box) \
            else None
        for s, split in enumerate(self.splits):
            self.control.actors.agent_policy[self.worker, s] = self._initial_policies(s, agents)
            while len(self._free_slots()) < agents:  # a replacement for a worker that died while learners lagged
                if self.control.runner.stop[0]:
                    raise SystemExit(0)
                self._apply_messages(timeout=0.05)
            self._use_slots(s, self._take_slots(agents))
            for i, env in enumerate(split.envs):
                self._calling(RESET, s * self.envs_per_split + i)
                traj.write_obs(split.slots[i * a:(i + 1) * a], 0, self._first_obs(s, i, env))
            self._calling(NO_CALL, 0)
            traj.rnn_states[split.slots, 0] = 0.0
            for i in range(len(split.envs) if self.shaping_keys else 0):
                self._apply_shaping(s, i)

    def _initial_policies(self, s: int, n: int) -> np.ndarray:
        """With --agent_policy_mapping=split, split s of worker w belongs to policy (w * splits + s) % policies for
        good: a step of it needs one forward pass. Otherwise the matchmaker's draw, renewed at every episode start."""
        if self.cfg.agent_policy_mapping == "split":
            split_index = self.worker * self.layout.num_splits + s
            return np.full(n, split_index % self.cfg.num_policies, dtype=np.int16)
        return self.matchmaker.draw(n // self.num_agents)

    # ---------------------------------------------------------------- main loop
    def run(self) -> None:
        self.init_envs()
        self.timing = Timing()  # time shares describe the main loop, not env creation
        self.report_queue.put(("ready", f"actor_{self.worker}"))
        if self.cfg.decorrelate_experience_max_seconds > 0:
            time.sleep(self.rng.uniform(0, self.cfg.decorrelate_experience_max_seconds))
        for s in range(len(self.splits)):
            self._request_actions(s)
        while not self.control.runner.stop[0]:
            stepped = False
            for s in range(len(self.splits)):
                if self._answered(s):
                    self._step_split(s)
                    stepped = True
            if not stepped:
                with self.timing.time("wait_actions"):
                    self._sleep_until_answered()
            self._maybe_report()
        self._report()
        for split in self.splits:
            for env in split.envs:
                env.close()

    def _answered(self, s: int) -> bool:
        """Whether every policy asked at split s's last request has written its actions."""
        return all(self.answered[p, s] == self.requested[p, s] for p in self.splits[s].acting)

    def _sleep_until_answered(self) -> None:
        """Block on the inbox until an inference worker wakes this actor (or WAKE_TIMEOUT_S passes);
        slot releases that arrive meanwhile are applied."""
        self.control.actors.waiting[self.worker] = 1
        if not any(self._answered(s) for s in range(len(self.splits))):  # an answer may predate the flag
            self._apply_messages(timeout=WAKE_TIMEOUT_S)
        self.control.actors.waiting[self.worker] = 0

    def _apply_messages(self, timeout: float) -> None:
        """Sleep until a message comes (or the timeout passes). Messages are only wake-ups: from inference
        ("wake": actions are written) or from a learner ("released": it has read slots of this worker)."""
        with contextlib.suppress(Empty):
            self.inbox.get_many(block=timeout > 0, timeout=timeout)

    # ---------------------------------------------------------------- stepping
    def _env_actions(self, actions: np.ndarray) -> list:
        """Per env, what its step takes: one agent's action, or a list with every agent's."""
        if self.plain_discrete:
            return actions.tolist()
        converted = [to_env_action(self.action_space, action) for action in actions]
        a = self.num_agents
        return converted if a == 1 else [converted[i:i + a] for i in range(0, len(converted), a)]

    def _step_split(self, s: int) -> None:
        """Step every env of split s with the actions inference wrote, store what the envs returned.

        This runs thousands of times a second in every actor, with caches cold after each env's step (the
        env may sleep or wait, and other processes run meanwhile). So the loop over envs only collects
        results in Python lists; the numpy writes come after it, back to back, where their code is warm.
        Rewards are stored as the env gave them; the learner scales and clips them."""
        split, traj = self.splits[s], self.traj
        t, slots, a = split.t, split.slots, self.num_agents
        env_actions = self._env_actions(traj.actions[slots, t])
        rewards: list = []
        observations: list = []
        ended: list[tuple[int, int, dict]] = []  # (env, done code, the info of its last step)
        started = time.perf_counter()
        w, call, call_env, call_since = self.worker, self.call, self.call_env, self.call_since
        first_env, clock = s * self.envs_per_split, time.monotonic
        call_since[w] = clock()  # written before the call it times (the runner may read at any moment)
        call[w] = STEP
        for i, env in enumerate(split.envs):
            call_since[w], call_env[w] = clock(), first_env + i  # the timeout is per env call
            try:
                obs, reward, terminated, truncated, info = env.step(env_actions[i])
                if terminated or truncated:
                    ended.append((i, TERMINATED if terminated else TRUNCATED, info))
                    call[w] = RESET
                    obs, _ = env.reset()
                    call[w] = STEP
            except Exception:
                obs, reward = self._rebuild_env(s, i), 0.0 if a == 1 else np.zeros(a)
                ended.append((i, TERMINATED, {}))
                self._calling(STEP, first_env + i)
            rewards.append(reward)
            observations.append(obs)
        call[w] = NO_CALL
        self.timing.add("env_step", time.perf_counter() - started)
        if split.obs_rows:
            for row, obs in zip(split.obs_rows, observations):
                row[t + 1] = obs
        else:
            for i, obs in enumerate(observations):
                traj.write_obs(slots[i * a:(i + 1) * a], t + 1, obs)

        if a > 1:
            rewards = np.concatenate(rewards).tolist()  # [envs][agents] -> one per env-agent
        if not math.isfinite(sum(rewards)):
            rewards = self._sanitize_rewards(s, rewards)
        traj.rewards[slots, t] = rewards
        episode_reward = split.episode_reward
        for j, reward in enumerate(rewards):
            episode_reward[j] += reward
        split.steps += 1
        self.env_steps += len(slots)
        if ended:
            self._end_episodes(s, ended)
        split.t = t + 1
        if split.t == self.layout.rollout:
            self._finish_rollout(s)
            split.t = 0
        self._request_actions(s)

    def _end_episodes(self, s: int, ended: list[tuple[int, int, dict]]) -> None:
        """Mark the ends in the trajectory, report finished episodes, start new ones (policy, RNN state).

        Envs that end an episode per life (Atari) report the whole game's score as
        `info["true_episode_reward"]` at its end; for them only game ends are reported."""
        split, traj, a = self.splits[s], self.traj, self.num_agents
        t = split.t
        codes = np.zeros(len(split.slots), dtype=np.uint8)
        policies = self.control.actors.agent_policy[self.worker, s]
        for i, code, info in ended:
            codes[i * a:(i + 1) * a] = code
            true_score = info.get("true_episode_reward")
            if true_score is None and getattr(split.envs[i], "reports_true_episode_reward", False):
                continue  # a life lost, not a game over: keep counting the game's reward and length
            extra = extra_stats(info)
            returns = []
            for j in range(i * a, (i + 1) * a):
                reward = float(split.episode_reward[j] if true_score is None else true_score)
                returns.append(reward)
                if policies[j] < self.cfg.num_policies:  # a snapshot's episodes are only rated (below)
                    self.finished_episodes.append((int(policies[j]), reward, split.steps - split.episode_start[j],
                                                   self._objective(info, extra, reward), extra))
                split.episode_reward[j] = 0.0
                split.episode_start[j] = split.steps
            if a > 1 and self.num_acting > 1:
                players = policies[i * a:(i + 1) * a].tolist()
                versions = traj.policy_versions[split.slots[i * a:(i + 1) * a], t].tolist()
                self.finished_games.append(([acting_name(self.cfg, p, v) for p, v in zip(players, versions)], returns))
        traj.dones[split.slots, t] = codes
        dones = codes > 0
        if self.cfg.use_rnn:
            traj.rnn_states[split.slots[dones], t + 1] = 0.0
        if self.num_acting > 1:
            if self.cfg.agent_policy_mapping == "episode":
                self._redraw_policies(s, dones, t + 1)
            if self.shaping_keys:
                for i, _, _ in ended:
                    self._apply_shaping(s, i)

    def _objective(self, info: dict, extra: dict[str, float], episode_reward: float) -> float | None:
        """What PBT ranks policies by (--pbt_target_objective): by default the env's `info["true_objective"]`
        at the episode's end, else the episode's return; or any numeric value the last step's info (or its
        `episode_extra_stats`) names."""
        name = self.cfg.pbt_target_objective
        if name == "true_objective":
            return float(info.get("true_objective", episode_reward))
        value = info.get(name, extra.get(name))
        return float(value) if isinstance(value, (int, float, np.number)) else None

    def _apply_shaping(self, s: int, i: int) -> None:
        """Give env i of split s the reward-shaping scheme of the policy its first agent plays for."""
        policy = learning_policy(self.cfg, int(self.control.actors.agent_policy[self.worker, s, i * self.num_agents]))
        scheme = dict(zip(self.shaping_keys, self.control.runner.reward_shaping[policy].tolist()))
        self.splits[s].envs[i].get_wrapper_attr("set_reward_shaping")(scheme)

    def _redraw_policies(self, s: int, dones: np.ndarray, from_t: int) -> None:
        """New episodes draw their policy; the rest of their trajectory rows is theirs."""
        policies = self.control.actors.agent_policy[self.worker, s]
        policies[dones] = self.matchmaker.draw(int(dones.sum()) // self.num_agents)  # all agents of an env end together
        self.traj.policy_ids[self.splits[s].slots[dones], from_t:] = policies[dones, None]

    def _sanitize_rewards(self, s: int, rewards: list[float]) -> list[float]:
        """Non-finite rewards become 0 (learning from them would poison every statistic); each env that gives
        one is logged once and every such reward counted (the status line shows the count)."""
        clean = []
        for j, reward in enumerate(rewards):
            if not math.isfinite(reward):
                self.nonfinite_rewards += 1
                env = j // self.num_agents
                if (s, env) not in self.nonfinite_reported:
                    self.nonfinite_reported.add((s, env))
                    log.warning("actor %d: env %d of split %d returned a non-finite reward (%s); it is stored as 0 "
                                "(further ones from this env are only counted)", self.worker, env, s, reward)
                reward = 0.0
            clean.append(reward)
        return clean

    def _rebuild_env(self, s: int, i: int) -> np.ndarray:
        """An env that raised loses its episode, not the worker: log it, build it anew, reset.

        The traceback is logged the first time this worker sees an error (same exception, message and place);
        repeats are only counted (the status line shows the count), so a flaky env cannot flood the log."""
        self.env_errors += 1
        error = sys.exc_info()[1]
        frame = traceback.extract_tb(error.__traceback__)[-1]
        key = f"{type(error).__name__}: {error} at {frame.filename}:{frame.lineno}"
        if key not in self.errors_seen:
            self.errors_seen.add(key)
            log.warning("actor %d: env %d of split %d raised; rebuilding it (repeats of this error are only "
                        "counted):\n%s", self.worker, i, s, traceback.format_exc())
        with contextlib.suppress(Exception):
            self.splits[s].envs[i].close()
        env = self._make_env(s, i)
        self.splits[s].envs[i] = env
        self._calling(RESET, s * self.envs_per_split + i)
        obs, _ = env.reset()
        return obs

    def _acting_policies(self, s: int) -> list[int]:
        """The policies acting for some env-agent of split s (np.unique costs ~150 us with cold caches)."""
        if self.num_acting == 1:
            return [0]
        return sorted(set(self.control.actors.agent_policy[self.worker, s].tolist()))

    def _request_actions(self, s: int) -> None:
        """Ask every policy acting in split s for actions at its current step; wake the idle ones."""
        split, control, w = self.splits[s], self.control, self.worker
        split.acting = self._acting_policies(s)
        for policy in split.acting:
            control.actors.request_step[policy, w, s] = split.t
            control.actors.request_count[policy, w, s] += 1  # publishes the request: written last
            group = self.inference_group[policy]
            if control.inference.idle[group, self.inference_index]:
                with contextlib.suppress(Full):  # a full queue has wake-ups enough
                    self.inference_queues[group].put_nowait(("wake",))

    # ---------------------------------------------------------------- trajectory slots
    def _finish_rollout(self, s: int) -> None:
        """Hand the filled slots to the learners, then move the split onto fresh slots.

        The learner of every policy that acted in a slot owes it a read (`slot_owed`, set first); the message
        that follows only saves the learner from finding it by its periodic scan."""
        traj, rollout, owed = self.traj, self.layout.rollout, self.control.slot_owed
        filled = self.splits[s].slots
        if self.trajs_sent == 0:
            self.base_version = int(self.control.learners.policy_version[0])
        self.trajs_sent += len(filled)
        if self.num_acting == 1:
            sent = [(0, filled.tolist())]
        else:
            present = [set(traj.policy_ids[slot].tolist()) for slot in filled]
            sent = [(policy, [int(slot) for slot, policies in zip(filled, present) if policy in policies])
                    for policy in range(self.cfg.num_policies)]
        for policy, slots in sent:
            if slots:
                owed[policy, slots] = 1
                with contextlib.suppress(Full):  # the learner's scan finds the slots anyway
                    self.learner_inboxes[policy].put_nowait(("traj", slots))
        self.in_use[filled - self.slot_range.start] = False

        fresh = self._wait_for_slots(len(filled), s)
        if fresh is None:  # stopping: nothing more will be learned from this split
            return
        traj.copy_obs(fresh, 0, filled, rollout)
        traj.rnn_states[fresh, 0] = traj.rnn_states[filled, rollout]
        self._use_slots(s, fresh)

    def _use_slots(self, s: int, slots: np.ndarray) -> None:
        """Point split s at new slots; policy ids are written for the whole rollout up front, and done
        codes cleared (a step writes them only when an episode ends)."""
        split = self.splits[s]
        split.slots = slots
        if self.single_obs is not None:
            split.obs_rows = [self.single_obs[slot] for slot in slots.tolist()]
        self.control.actors.cur_slot[self.worker, s] = slots
        self.traj.policy_ids[slots] = self.control.actors.agent_policy[self.worker, s][:, None]
        self.traj.dones[slots] = 0

    def _wait_for_slots(self, n: int, s: int) -> np.ndarray | None:
        """Block until n free slots exist and no learner of this split's policies asked for a pause.

        Returns None when the run stops while waiting."""
        policies = [learning_policy(self.cfg, p) for p in self._acting_policies(s)]
        start = time.perf_counter()
        while (len(self._free_slots()) < n or self.control.learners.pause_collection[policies].any()
               or self._learner_behind()):
            if self.control.runner.stop[0]:
                return None
            self._apply_messages(timeout=0.05)  # learners wake this worker when they release slots
            self._maybe_report()
        self.timing.add("wait_buffers", time.perf_counter() - start)
        return self._take_slots(n)

    def _learner_behind(self) -> bool:
        """In lockstep, whether the learner has not yet trained on every full iteration sent to it."""
        if not self.lockstep:
            return False
        expected = self.base_version + self.trajs_sent // trajectories_per_iteration(self.cfg)
        return int(self.control.learners.policy_version[0]) < expected

    def _free_slots(self) -> np.ndarray:
        """This worker's slots that no split fills and no learner owes a read (indices into slot_range)."""
        owed = self.control.slot_owed[:, self.slot_range.start:self.slot_range.stop]
        return np.flatnonzero(~(owed.any(axis=0) | self.in_use))

    def _take_slots(self, n: int) -> np.ndarray:
        taken = self._free_slots()[:n]
        self.in_use[taken] = True
        return taken + self.slot_range.start

    # ---------------------------------------------------------------- reporting
    def _state(self) -> str:
        """What this worker is waiting for, for the runner's stall report."""
        waiting = [str(s) for s in range(len(self.splits)) if not self._answered(s)]
        return f"splits waiting for actions [{','.join(waiting)}], {len(self._free_slots())} free slots"

    def _maybe_report(self) -> None:
        if time.monotonic() - self.last_report > REPORT_INTERVAL_S:
            self._report()

    def _report(self) -> None:
        self.last_report = time.monotonic()
        self.report_queue.put(("actor", self.worker, {
            "env_steps": self.env_steps,
            "episodes": self.finished_episodes,
            "games": self.finished_games,
            "timing": self.timing.take(),
            "env_errors": self.env_errors,
            "nonfinite": self.nonfinite_rewards,
            "state": self._state(),
        }))
        self.env_steps = 0
        self.env_errors = 0
        self.nonfinite_rewards = 0
        self.finished_episodes = []
        self.finished_games = []


def run_actor_worker(cfg, layout, worker, traj, control, inbox, inference_queues, learner_inboxes,
                     report_queue) -> None:
    cpu = worker if cfg.set_workers_cpu_affinity else None
    init_worker(cfg, cpu=cpu, single_thread=cfg.force_envs_single_thread, extra_niceness=cfg.actor_niceness,
                batch_scheduling=cfg.actor_sched_batch)
    ActorWorker(cfg, layout, worker, traj, control, inbox, inference_queues, learner_inboxes, report_queue).run()
