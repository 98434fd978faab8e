"""Every message that crosses a process boundary, as a typed record.

Bulk data never travels in a queue (it lives in shared memory, appo/memory/); a message says what happened.
Receivers dispatch on the record's type. Torch-free: actors and the runner import it.

Two kinds of message stay plain values, because they are sent thousands of times a second on the hot path:

- a wake-up (`WAKE`, to an actor's inbox, an inference worker's wake-up queue or the cluster inbox): its content
  is never read, the sleeper only needs to return from `get_many`;
- a trajectory hint (`SlotHint`, a list of slot indices, to a learner's inbox): the slots are also marked in
  shared memory (`slot_owed`), the hint only saves the learner a scan.

Measured on this project's 2-core machine (pickle dumps + loads, which faster_fifo does per message): a one-field
tuple 0.4 us and a 16-slot list 0.7 us, against 2.3-3.3 us for a frozen dataclass or NamedTuple of the same
content (unpickling looks the class up by name). Reports, once a second per worker, are records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------- hot path: plain values
WAKE = 0
"""A wake-up: inference -> actor (actions written), learner -> actor (slots released), actor -> inference."""

SlotHint = list
"""A learner's inbox: `list[int]` of slots that hold finished trajectories for it (also marked in `slot_owed`)."""


# ---------------------------------------------------------------- reports to the runner
@dataclass(frozen=True)
class EpisodeEnd:
    """An episode that ended in an actor; the runner fills `env_steps` before a hook sees it."""

    policy: int
    reward: float  # the episode's return (a multi-agent env: this agent's)
    length: int
    objective: float | None  # what PBT ranks by (--pbt_target_objective), when the episode reports it
    extra: dict[str, float]  # the env's info["episode_extra_stats"]
    env_steps: int = -1  # the policy's env steps when the runner heard of it (-1 inside the actor's report)


@dataclass(frozen=True)
class GameEnd:
    """A multi-agent game played by more than one acting id, for the ratings: players' names and scores (the env's
    per-agent true objective where it reports one, else the episode return)."""

    players: list[str]
    scores: list[float]


@dataclass(frozen=True)
class ActorReport:
    worker: int
    env_steps: int  # since the last report
    episodes: list[EpisodeEnd]
    games: list[GameEnd]
    timing: dict[str, float]  # seconds per activity since the last report
    env_errors: int
    illegal_actions: int  # actions its envs were given that their action masks did not allow (envs/action_masks.py)
    nonfinite: int  # non-finite rewards stored as 0
    state: str  # what it waits for, for the stall report
    every_env_ended: bool  # each of its envs has ended an episode since the worker started (unbiased windows)


@dataclass(frozen=True)
class InferenceReport:
    name: str
    samples: int
    batches: int
    timing: dict[str, float]
    nonfinite: int  # non-finite observation values fed as 0
    state: str


@dataclass(frozen=True)
class LearnerReport:
    policy: int
    stats: dict[str, float]
    env_steps: int  # trained + dropped, in total
    version: int
    samples: int  # trained since the last report
    dropped: int  # trajectories dropped for lag since the last report
    train_steps: int
    timing: dict[str, float]
    skipped_updates: int  # non-finite loss or gradient
    nonfinite: int  # non-finite observation values fed as 0
    device: str
    state: str


@dataclass(frozen=True)
class LearnerIteration:
    policy: int
    version: int  # of the weights the iteration produced
    env_steps: int
    stats: dict[str, float]  # the iteration's mean losses, entropy, KL, ...


@dataclass(frozen=True)
class CheckpointSaved:
    policy: int
    path: str
    version: int
    env_steps: int
    best: dict[str, Any] | None = None  # for checkpoint_p<policy>/best.pth: metric, value and the evaluation


@dataclass(frozen=True)
class Evaluation:
    policy: int
    version: int
    env_steps: int
    results: dict[str, float]  # reward, reward_std, length, episodes and the env's episode metrics (means)


@dataclass(frozen=True)
class ClusterReport:
    seconds: float
    busy: float
    groups: list[dict[str, Any]] = field(default_factory=list)  # per sampler group: node, env steps, bytes moved


@dataclass(frozen=True)
class WorkerReady:
    name: str


@dataclass(frozen=True)
class WorkerFailed:
    name: str
    cause: str  # the traceback, or a fatal error's one line
    fatal: bool  # a FatalError: the run stops instead of replacing the worker
    lost_peer: bool = False  # a LostPeer: another member of its group died first, and is blamed


# ---------------------------------------------------------------- inboxes
@dataclass(frozen=True)
class SetHyperparams:
    """Runner -> learner: PBT's new hyper-parameters for the policy."""

    values: dict[str, float]


@dataclass(frozen=True)
class ExportWeights:
    """Runner -> learner (PBT donor): save your weights for policy `receiver` and tell its learner."""

    receiver: int


@dataclass(frozen=True)
class AdoptWeights:
    """Learner -> learner: take the weights saved at `path` by `donor` (PBT exploit)."""

    path: str
    donor: int
    version: int


@dataclass(frozen=True)
class EvaluateRequest:
    """Runner -> evaluator: evaluate the newest weights of `policy`."""

    policy: int
