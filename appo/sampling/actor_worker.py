"""Actor (rollout) worker: steps `--num_envs_per_worker` envs in `--worker_num_splits` splits.

Each split writes observations straight into its trajectory slots, asks the inference worker of each acting id
in it for actions (by bumping a request counter in shared memory), and steps again when the answer counters catch
up; meanwhile the other splits step (double buffering). Queue messages are only needed to wake a process that
sleeps: an idle inference worker, or this actor when no split can step. After `--rollout` steps the filled slots
go to the learners and the split moves onto slots no learner owes a read. All of this worker's state that others
depend on lives in shared memory, so a replacement started by the runner after a crash carries on in the same
buffers.

The parts, each in its module: `EnvStepper` (env_stepper.py) owns the envs (with batched sampling `VectorStepper`,
vector_stepper.py: one vectorised env per split, stepped and written in one operation), `SlotAllocator` (slots.py) the
trajectory slots, `EpisodeTracker` (episodes.py) returns, lengths and finished episodes, `AgentPolicies`
(agent_policies.py) who plays each env-agent, `ActionRequests` (requests.py) the request/answer protocol;
`ActorWorker` here runs the main loop and moves data between the envs and the slots.

Writes: control.actors.cur_slot, agent_policy, request_step, request_count and waiting (and, through its parts,
control.actors.call*, control.slot_owed); in its slots traj.obs, rnn_states (zeroed at episode starts), rewards,
dones and policy_ids. Sends: WAKE to idle inference workers, a SlotHint to learners, WorkerReady and ActorReport to
the runner. This module never imports torch: it sees the shared buffers as numpy arrays.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

from appo.config.topology import num_acting_ids
from appo.config.views import ActorConfig
from appo.envs.vector import steps_batched
from appo.memory.buffers import WAKE_TIMEOUT_S
from appo.messages import ActorReport, WorkerReady
from appo.sampling.agent_policies import AgentPolicies
from appo.sampling.env_stepper import EnvStepper
from appo.sampling.episodes import EpisodeTracker
from appo.sampling.requests import ActionRequests
from appo.sampling.slots import SlotAllocator
from appo.sampling.vector_stepper import VectorStepper
from appo.spaces import MASK_KEY, SINGLE_KEY
from appo.utils.process import init_worker
from appo.utils.timing import Timing
from appo.workers.context import WorkerContext
from appo.workers.roles import WorkerRole

# The longest one step of the main loop blocks: a wait for free slots (learners send a wake-up when they release
# some; this bounds a missed one and how late the stop flag is seen). A wait for answers is WAKE_TIMEOUT_S.
MAX_BLOCK_S = 0.05


def report_interval_s(num_workers: int) -> float:
    """How often an actor reports: every 0.25 s (a run with --target_reward stops that soon after the mean crosses
    it), but the runner takes at most 64 actor reports a second: each costs it a pickle and a tally, and with 64
    actors on 2 cores reports every 0.25 s cost 10% of sampler-only throughput (docs/PERFORMANCE.md)."""
    return 0.25 * max(1.0, num_workers / 16)


class Split:
    """Where one split stands: step `t` inside its current trajectory, the slots its env-agents fill (a copy of
    control.actors.cur_slot[worker, split]; none before its first)."""

    def __init__(self) -> None:
        self.t = 0
        self.slots = np.zeros(0, dtype=np.int64)
        self.obs_rows: list[np.ndarray] = []  # per env-agent, its slot's observation rows (single Box obs only)


class ActorWorker(WorkerRole):
    """Steps the splits whose actions are answered, asks for the next ones, and moves splits onto fresh slots.

    `setup()` makes the envs; `step(timeout)` starts the splits (first slots, env resets) and then does one round
    of stepping; none of it blocks longer than `timeout`, so a serial run can call `step(0.0)`."""

    STEP_TIMEOUT_S = MAX_BLOCK_S

    def __init__(self, ctx: WorkerContext, worker: int):
        ctx = ctx.for_role(ActorConfig)  # the flags this role reads, and no others
        cfg, layout, control = ctx.cfg, ctx.layout, ctx.control
        self.cfg, self.layout, self.worker, self.traj, self.control = cfg, layout, worker, ctx.traj, control
        self.num_agents, self.num_acting = layout.num_agents, num_acting_ids(cfg)
        self.report_queue = ctx.queues.report
        self.requests = ActionRequests(ctx, worker)
        self.rng = np.random.default_rng(None if cfg.seed is None else cfg.seed + 1000 * worker)
        self.timing = Timing()
        self.batched = steps_batched(cfg.env, cfg.batched_sampling)  # one vectorised env per split
        self.stepper = (VectorStepper if self.batched else EnvStepper)(ctx, worker, self.rng, self.timing)
        self.slots = SlotAllocator(ctx, worker)
        self.episodes = EpisodeTracker(ctx, worker, self.batched)
        self.players = AgentPolicies(ctx, worker, self.rng)
        self.splits = [Split() for _ in range(layout.num_splits)]
        self.single_obs: np.ndarray | None = None  # traj.obs' only array, when that is all the env observes
        self.env_steps = 0  # since the last report
        self.started = 0  # splits that have their first slots
        self.collect_from: float | None = None  # once every split started: when the first requests go out
        self.collecting = False
        self.waiting_split: int | None = None  # a split whose rollout ended with no fresh slots to move onto
        self.waiting_since = 0.0
        self.last_report = time.monotonic()
        self.report_interval_s = report_interval_s(cfg.num_workers)

    # ---------------------------------------------------------------- main loop
    @classmethod
    def main(cls, ctx: WorkerContext, worker: int) -> None:
        """The entry point of the actor's process: its scheduling and threads, then `run()`."""
        cfg = ctx.cfg
        init_worker(cfg, cpu=worker if cfg.set_workers_cpu_affinity else None,
                    single_thread=cfg.force_envs_single_thread, extra_niceness=cfg.actor_niceness,
                    batch_scheduling=cfg.actor_sched_batch)
        cls(ctx, worker).run()


    def setup(self) -> None:
        """Make the envs (as long as that takes); the splits take their first slots in `step`."""
        self.control.actors.waiting[self.worker] = 0  # a predecessor that crashed may have left it raised
        self.stepper.make_envs()
        first = self.stepper.envs[0][0]
        # Fast path for the common case of envs stepped one by one: one agent and a single Box observation.
        if self.num_agents == 1 and isinstance(first.observation_space, gym.spaces.Box) and not self.batched:
            self.single_obs = self.traj.obs[SINGLE_KEY]

    def step(self, timeout: float) -> None:
        """One round, blocking at most `timeout` seconds: until collection runs, the next part of the start;
        then, unless a split still waits for fresh slots, step every split whose actions are answered; with
        none answered, wait for a wake-up."""
        if not self.collecting:
            self._start(timeout)
            return
        if self.waiting_split is not None and not self._resume_waiting_split(timeout):
            self._maybe_report()
            return
        stepped = False
        for s in range(len(self.splits)):
            if self.answered(s):
                self._step_split(s)
                stepped = True
                if self.waiting_split is not None:  # no other split steps meanwhile: the slots it handed over
                    break  # hold its last observation, which another split could take once a learner read them
        if not stepped:
            with self.timing.time("wait_actions"):
                self.requests.wait_for_answers(min(timeout, WAKE_TIMEOUT_S))
        self._maybe_report()

    def close(self) -> None:
        """Send the last report (once ready) and close the envs."""
        if self.collect_from is not None:
            self.report()
        self.stepper.close()

    def _start(self, timeout: float) -> None:
        """The start, resumed at every step until done: each split takes its first slots in turn (a replacement
        for a worker that died while the learners lagged may find too few free: it waits for a wake-up and
        retries at the next step) and resets its envs; then the worker reports ready, waits out its random
        --decorrelate_experience_max_seconds delay and asks for the first actions."""
        while self.started < len(self.splits):
            slots = self.slots.take(self.layout.agents_per_split)
            if slots is None:
                self.requests.wait_for_wakeup(min(timeout, MAX_BLOCK_S))
                return
            self._start_split(self.started, slots)
            self.started += 1
        if self.collect_from is None:
            self.timing.take()  # time shares describe the main loop, not env creation
            self.report_queue.put(WorkerReady(f"actor_{self.worker}"))
            delay = self.cfg.decorrelate_experience_max_seconds
            self.collect_from = time.monotonic() + (self.rng.uniform(0, delay) if delay > 0 else 0.0)
        delay = self.collect_from - time.monotonic()
        if delay > 0:
            time.sleep(min(timeout, delay))
            return
        for s in range(len(self.splits)):
            self._request_actions(s)
        self.collecting = True

    def _start_split(self, s: int, slots: np.ndarray) -> None:
        """Split s's first slots: draw who plays, reset its envs into step 0, clear the RNN states, and give the
        envs their policy's reward shaping."""
        self.players.start(s)
        self._use_slots(s, slots)
        self._write_obs(s, 0, self.stepper.first_observations(s))
        self.episodes.midway[s] = self.stepper.midway[s]
        self.traj.rnn_states[slots, 0] = 0.0
        for i, env in enumerate(self.stepper.envs[s] if self.players.shaping_keys else ()):
            self.players.shape(s, i, env)

    # ---------------------------------------------------------------- requests and answers
    def answered(self, s: int) -> bool:
        """Whether every acting id asked at split s's last request has written its actions."""
        return self.requests.answered(s)

    def _request_actions(self, s: int) -> None:
        """Ask every acting id of split s for actions at its current step."""
        self.requests.request(s, self.splits[s].t, self.players.acting_ids(s))

    # ---------------------------------------------------------------- stepping
    def _step_split(self, s: int) -> None:
        """Step every env of split s with the actions inference wrote, store what the envs returned, and ask for
        the next actions (after a move onto fresh slots at the rollout's end).

        The numpy writes come after the loop over envs, back to back, where their code is warm. Rewards are
        stored as the env gave them; the learner scales and clips them. A batched split's actions are read, and its
        observations and rewards written, in one operation each."""
        split, traj = self.splits[s], self.traj
        t, slots = split.t, split.slots
        rewards, observations, ended = self.stepper.step(s, traj.actions[slots, t])
        self._write_obs(s, t + 1, observations)
        traj.rewards[slots, t] = (self.episodes.add_reward_array(s, rewards) if self.batched
                                  else self.episodes.add_rewards(s, rewards))
        # A turn-based env's waiting seats make no sample: the env steps counted are the moves.
        self.env_steps += int((traj.obs[MASK_KEY][slots, t] > 0).any(-1).sum()) if self.stepper.turn_based \
            else len(slots)
        if ended:
            self._end_episodes(s, ended)
        split.t = t + 1
        if split.t == self.layout.rollout:
            split.t = 0
            self.slots.hand_over(slots)
            self.waiting_split, self.waiting_since = s, time.perf_counter()
            if not self._move_to_fresh_slots(s):
                return  # it asks for actions once it has them (`step` retries)
        self._request_actions(s)

    def _write_obs(self, s: int, t: int, observations) -> None:
        """Store split s's observations at step t of its slots: a batch in one operation (per observation key), else
        one env's at a time."""
        split, traj, a = self.splits[s], self.traj, self.num_agents
        if self.batched:
            traj.write_obs(split.slots, t, observations)
        elif split.obs_rows:
            for row, obs in zip(split.obs_rows, observations):
                row[t] = obs
        else:
            for i, obs in enumerate(observations):
                traj.write_obs(split.slots[i * a:(i + 1) * a], t, obs)

    def _end_episodes(self, s: int, ended: list[tuple[int, int, dict]]) -> None:
        """Mark the ends in the trajectory, record the finished episodes, start new ones (players, RNN state)."""
        split, traj, a = self.splits[s], self.traj, self.num_agents
        t = split.t
        codes = np.zeros(len(split.slots), dtype=np.uint8)
        if self.batched:  # one agent per sub-env
            ids = [i for i, _, _ in ended]
            codes[ids] = [code for _, code, _ in ended]
            self.episodes.end_sub_envs(s, ids, [info for _, _, info in ended], self.stepper.envs[s], split.slots, t)
        else:
            for i, code, info in ended:
                codes[i * a:(i + 1) * a] = code
                self.episodes.end_episode(s, i, self.stepper.envs[s][i], info, split.slots, t)
        traj.dones[split.slots, t] = codes
        dones = codes > 0
        if self.cfg.use_rnn:
            traj.rnn_states[split.slots[dones], t + 1] = 0.0
        if self.num_acting > 1:
            self.players.redraw(s, dones, split.slots, t + 1)
            for i, _, _ in ended if self.players.shaping_keys else ():
                self.players.shape(s, i, self.stepper.envs[s][i])

    # ---------------------------------------------------------------- trajectory slots
    def _resume_waiting_split(self, timeout: float) -> bool:
        """Retry the move of the split waiting for fresh slots; once moved it asks for actions, else wait for a
        wake-up (at most `timeout`). Whether it moved."""
        s = self.waiting_split
        if self._move_to_fresh_slots(s):
            self._request_actions(s)
            return True
        self.requests.wait_for_wakeup(min(timeout, MAX_BLOCK_S))
        return False

    def _move_to_fresh_slots(self, s: int) -> bool:
        """Move split s, whose rollout ended, onto fresh slots with its last observation and RNN state, if enough
        are free and no learner of its policies asked for a pause; whether it moved."""
        split, rollout = self.splits[s], self.layout.rollout
        paused = self.slots.collection_paused(self.players.learning_policies(s))
        fresh = None if paused else self.slots.take(len(split.slots))
        if fresh is None:
            return False
        self.timing.add("wait_buffers", time.perf_counter() - self.waiting_since)
        self.traj.copy_obs(fresh, 0, split.slots, rollout)
        self.traj.rnn_states[fresh, 0] = self.traj.rnn_states[split.slots, rollout]
        self._use_slots(s, fresh)
        self.waiting_split = None
        return True

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

    # ---------------------------------------------------------------- reporting
    def _state(self) -> str:
        """What this worker is waiting for, for the runner's stall report."""
        waiting = [str(s) for s in range(len(self.splits)) if not self.answered(s)]
        return f"splits waiting for actions [{','.join(waiting)}], {len(self.slots.free())} free slots"

    def _maybe_report(self) -> None:
        if time.monotonic() - self.last_report > self.report_interval_s:
            self.report()

    def report(self) -> None:
        """Send the runner what happened since the last report."""
        self.last_report = time.monotonic()
        episodes, games, nonfinite = self.episodes.take()
        self.report_queue.put(ActorReport(
            worker=self.worker, env_steps=self.env_steps, episodes=episodes, games=games, timing=self.timing.take(),
            env_errors=self.stepper.take_errors(), illegal_actions=self.stepper.take_illegal(), nonfinite=nonfinite,
            state=self._state(),
            every_env_ended=self.episodes.every_env_ended()))
        self.env_steps = 0
