"""Self-play and agent-to-policy mapping: Elo and the match table, the matchmaker, the snapshot pool of a policy
and of a real learner (taken, published, saved, restored), and that a learner trains on its own steps only."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from appo.config.cfg import ConfigError, parse_config
from appo.config.checks import MappingError
from appo.config.flags import Config
from appo.config.topology import learning_policy, num_acting_ids, snapshot_ids
from appo.learning.losses import gae
from appo.learning.policy import Policy, make_optimizer
from appo.learning.ppo import UPDATE_FIELDS, bootstrap_values, train_step
from appo.population.matchmaking import Matchmaker, acting_name
from appo.population.ratings import ELO_START, Ratings, elo_update, expected_score
from tests.conftest import LearnerRig


def flags(*args: str, num_agents: int = 2) -> Config:
    return parse_config(["--env=coop_multi_agent", *args], num_agents)


# ---------------------------------------------------------------- Elo and the match table
def test_elo_on_hand_made_results():
    assert expected_score(1000, 1000) == 0.5
    assert expected_score(1400, 1000) == pytest.approx(10 / 11)  # 400 points: 10 to 1
    assert elo_update(1000, 1000, 1.0, k=16) == (1008.0, 992.0)
    assert elo_update(1000, 1000, 0.5, k=16) == (1000.0, 1000.0)
    a, b = elo_update(1400, 1000, 0.0, k=16)  # the favourite loses: it drops by 16 * 10/11
    assert a == pytest.approx(1400 - 16 * 10 / 11) and b == pytest.approx(1000 + 16 * 10 / 11)

    ratings = Ratings()
    ratings.record_game(["p0", "p0@v100"], [1.0, -1.0])  # a win
    ratings.record_game(["p0@v100", "p0"], [0.0, 0.0])  # a draw, seats swapped
    ratings.record_game(["p0", "p0@v100"], [-1.0, 1.0])  # a loss
    ratings.record_game(["p0", "p0"], [1.0, -1.0])  # against its latest self: not a match
    record = ratings.pairs["p0"]["p0@v100"]
    assert (record.wins, record.draws, record.losses) == (1, 1, 1)
    mirror = ratings.pairs["p0@v100"]["p0"]
    assert (mirror.wins, mirror.draws, mirror.losses) == (1, 1, 1)
    assert record.mean_scores() == (0.0, 0.0)
    # Replay the same matches by hand: a snapshot starts at its policy's rating, which is ELO_START here.
    p, s = ELO_START, ELO_START
    for score in (1.0, 0.5, 0.0):
        p, s = elo_update(p, s, score)
    assert ratings.elo["p0"] == pytest.approx(p) and ratings.elo["p0@v100"] == pytest.approx(s)

    ratings.record_game(["p0", "p0@v200"], [1.0, -1.0])  # a new snapshot enters at p0's current rating
    assert ratings.elo["p0@v200"] == pytest.approx(p - (ratings.elo["p0"] - p))
    assert ratings.against("p0", snapshots=True).games == 4
    assert ratings.against("p0", snapshots=False).games == 0

    restored = Ratings.from_json(ratings.to_json())
    assert restored.elo == ratings.elo and restored.table() == ratings.table()
    assert ratings.table()[0].startswith("Elo: p0 ")
    assert "p0 vs p0@v100: 3 games, W/D/L 33.3%/33.3%/33.3%" in "\n".join(ratings.table())


def test_ratings_saved_before_scores_were_named_so_still_load():
    old = {"elo": {"p0": 1010.0, "p0@v5": 990.0},
           "pairs": {"p0": {"p0@v5": {"wins": 2, "draws": 0, "losses": 1, "return_sum": 3.0,
                                      "opponent_return_sum": -3.0}}}}
    record = Ratings.from_json(old).pairs["p0"]["p0@v5"]
    assert (record.games, record.score_sum, record.opponent_score_sum) == (3, 3.0, -3.0)


def test_three_player_game_is_three_matches():
    ratings = Ratings()
    ratings.record_game(["p0", "p1", "p0@v5"], [3.0, 2.0, 3.0])
    assert ratings.pairs["p0"]["p1"].wins == 1 and ratings.pairs["p0"]["p0@v5"].draws == 1
    assert ratings.pairs["p1"]["p0@v5"].losses == 1


# ---------------------------------------------------------------- acting ids and the matchmaker
def test_acting_ids():
    cfg = flags("--num_policies=2", "--self_play_opponents=3")
    assert num_acting_ids(cfg) == 8
    assert list(snapshot_ids(cfg, 0)) == [2, 3, 4] and list(snapshot_ids(cfg, 1)) == [5, 6, 7]
    assert [learning_policy(cfg, i) for i in range(8)] == [0, 1, 0, 0, 0, 1, 1, 1]
    assert acting_name(cfg, 1, 40) == "p1" and acting_name(cfg, 6, 40) == "p1@v40"


def constant_mapping(num_agents: int, num_policies: int, rng: np.random.Generator) -> list[int]:
    """A user mapping: agent i plays policy i % num_policies."""
    return [i % num_policies for i in range(num_agents)]


def bad_mapping(num_agents: int, num_policies: int, rng: np.random.Generator) -> list[int]:
    return [num_policies] * num_agents


def test_user_mapping_function_is_used_and_checked():
    cfg = flags("--num_policies=2", f"--policy_mapping={__name__}:constant_mapping")
    assert cfg.agent_policy_mapping == "episode"
    versions = np.full(2, -1)
    drawn = Matchmaker(cfg, 3, versions, np.random.default_rng(0)).draw(4)
    assert drawn.tolist() == [0, 1, 0] * 4
    cfg = dataclasses.replace(cfg, policy_mapping=f"{__name__}:bad_mapping")
    with pytest.raises(MappingError, match="expected 3 policy ids"):
        Matchmaker(cfg, 3, versions, np.random.default_rng(0)).draw(1)
    with pytest.raises(ConfigError, match="no function 'missing'"):
        flags(f"--policy_mapping={__name__}:missing")
    with pytest.raises(ConfigError, match="package.module:function"):
        flags("--policy_mapping=nocolon")
    with pytest.raises(ConfigError, match="draw per episode"):
        flags(f"--policy_mapping={__name__}:constant_mapping", "--agent_policy_mapping=split")


def test_default_mappings():
    cfg = flags("--num_policies=3")
    drawn = Matchmaker(cfg, 2, np.full(3, 0), np.random.default_rng(0)).draw(1000)
    assert set(drawn.tolist()) == {0, 1, 2} and (drawn[0::2] != drawn[1::2]).any()  # a draw per agent
    cfg = flags("--num_policies=3", "--pbt_mix_policies_in_one_env=False")
    drawn = Matchmaker(cfg, 2, np.full(3, 0), np.random.default_rng(0)).draw(1000)
    assert (drawn[0::2] == drawn[1::2]).all() and set(drawn.tolist()) == {0, 1, 2}  # one policy per env


def test_self_play_draws_one_learning_seat_against_a_snapshot():
    cfg = flags("--self_play_opponents=3", "--self_play_latest_fraction=0.0")
    versions = np.full(num_acting_ids(cfg), -1)
    versions[0] = 7
    matchmaker = Matchmaker(cfg, 2, versions, np.random.default_rng(0))
    assert (matchmaker.draw(50) == 0).all()  # no snapshot yet: the latest self
    versions[[1, 3]] = [2, 4]  # snapshots 1 and 3 exist, 2 not yet
    envs = matchmaker.draw(2000).reshape(-1, 2)
    assert ((envs == 0).sum(axis=1) == 1).all()  # exactly one seat learns in every game
    opponents = envs[envs != 0]
    assert set(opponents.tolist()) == {1, 3}
    assert abs((opponents == 1).mean() - 0.5) < 0.05  # drawn uniformly from the pool
    assert abs((envs[:, 0] == 0).mean() - 0.5) < 0.05  # the learning seat is random

    cfg = dataclasses.replace(cfg, self_play_latest_fraction=0.25)
    envs = Matchmaker(cfg, 2, versions, np.random.default_rng(1)).draw(4000).reshape(-1, 2)
    assert abs((envs == 0).all(axis=1).mean() - 0.25) < 0.03
    cfg = dataclasses.replace(cfg, self_play_latest_fraction=1.0)
    assert (Matchmaker(cfg, 2, versions, np.random.default_rng(1)).draw(100) == 0).all()


def test_self_play_flags_are_checked():
    with pytest.raises(ConfigError, match="needs a multi-agent env"):
        flags("--self_play_opponents=2", num_agents=1)
    with pytest.raises(ConfigError, match="self_play_latest_fraction"):
        flags("--self_play_opponents=2", "--self_play_latest_fraction=1.5")
    with pytest.raises(ConfigError, match="shared_inference_workers"):
        flags("--self_play_opponents=2", "--num_policies=2", "--shared_inference_workers=False")
    with pytest.raises(ConfigError, match="self_play_snapshot_every"):
        flags("--self_play_opponents=2", "--self_play_snapshot_every=0")


# ---------------------------------------------------------------- the snapshot pool
def test_policy_snapshot_pool_rotates_and_is_saved():
    cfg = flags("--self_play_opponents=2", "--self_play_snapshot_every=3")
    env_spaces = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    policy = Policy(0, cfg, env_spaces, torch.device("cpu"))
    taken = []
    for version in range(1, 13):
        policy.version = version
        with torch.no_grad():
            next(policy.model.parameters()).fill_(version)  # weights that say which version they are
        if policy.snapshot_due():
            taken.append((version, policy.take_snapshot()))
    assert taken == [(3, (0, None)), (6, (1, None)), (9, (0, 3)), (12, (1, 6))]  # the oldest is replaced
    assert [s["version"] for s in policy.snapshots] == [9, 12]
    name = next(name for name, _ in policy.model.named_parameters())
    assert [float(s["weights"][name].flatten()[0]) for s in policy.snapshots] == [9.0, 12.0]

    restored = Policy(0, cfg, env_spaces, torch.device("cpu"))
    restored.load_state_dict(policy.state_dict())
    assert [s["version"] for s in restored.snapshots] == [9, 12]
    smaller = Policy(0, flags("--self_play_opponents=1"), env_spaces, torch.device("cpu"))
    smaller.load_state_dict(policy.state_dict())  # a resumed run with a smaller pool keeps the newest
    assert [s["version"] for s in smaller.snapshots] == [12]


@pytest.fixture
def self_play_rig(tmp_path):
    from appo.memory.segments import unlink_segment

    rig = LearnerRig(str(tmp_path), "--num_policies=1", "--self_play_opponents=2", "--self_play_snapshot_every=2")
    yield rig
    for name in rig.names:
        unlink_segment(name)


@pytest.mark.slow
def test_learner_publishes_snapshots_and_restores_them(self_play_rig):
    rig = self_play_rig
    rig.traj.policy_ids[:] = 0
    learner = rig.learner(0)
    slots = list(range(learner.trajs_per_iteration))

    def train(iterations: int) -> None:
        for _ in range(iterations):
            rig.control.slot_owed[0, slots] = 1
            learner.train_iteration(slots)

    train(5)
    assert learner.policy.version == 5
    assert rig.control.learners.policy_version.tolist() == [5, 2, 4]  # snapshots of versions 2 and 4 are served
    published = learner.snapshot_weights[1].read_frozen()
    for name, tensor in learner.policy.snapshots[1]["weights"].items():
        assert torch.equal(published[name], tensor)
    learner.save()  # its pool: versions 2 and 4
    train(2)
    assert rig.control.learners.policy_version.tolist() == [7, 6, 4]  # 6 replaced the oldest, 2

    # A learner that replaces a dead one takes the pool from shared memory (newer than the checkpoint's).
    replacement = rig.learner(0)
    assert [s["version"] for s in replacement.policy.snapshots] == [6, 4]
    # A resumed run (fresh shared memory) publishes the checkpoint's pool again.
    rig.control.learners.policy_version[:] = -1
    resumed = rig.learner(0)
    assert [s["version"] for s in resumed.policy.snapshots] == [2, 4]
    assert rig.control.learners.policy_version[1:].tolist() == [2, 4]
    assert torch.equal(resumed.snapshot_weights[1].read_frozen()[name], published[name])


def test_learner_trains_only_on_its_own_side(self_play_rig):
    """Slots in which the learning policy (id 0) and its snapshots (ids 1, 2) take turns at episode ends, as
    the matchmaker does: the learner counts id 0's steps only, and its update does not depend on the rest."""
    rig = self_play_rig
    rng = np.random.default_rng(0)
    learner = rig.learner(0)
    slots = list(range(learner.trajs_per_iteration))
    rollout = rig.cfg.rollout
    for slot in slots:  # one episode ends at step k - 1 of the slot; the next is played by another id
        k, before, after = int(rng.integers(0, rollout + 1)), int(rng.integers(3)), int(rng.integers(3))
        rig.traj.policy_ids[slot, :k], rig.traj.policy_ids[slot, k:] = before, after
        rig.traj.dones[slot] = 0
        if 0 < k < rollout:
            rig.traj.dones[slot, k - 1] = 1
    ids = rig.traj.policy_ids[slots].copy()
    rig.control.slot_owed[0, slots] = 1
    steps_before = learner.policy.env_steps
    batch = learner.collect(slots)
    assert learner.policy.env_steps - steps_before == int((ids == 0).sum())
    assert torch.equal(batch["mask"], torch.from_numpy((ids == 0).astype(np.float32)))
    assert 0 < int(batch["mask"].sum()) < batch["mask"].numel()

    # Change everything the snapshots did: actions, log-probs, values, rewards. The update is the same.
    cfg, hp, model = rig.cfg, learner.policy.hyperparams, learner.policy.model
    state = {k: v.clone() for k, v in model.state_dict().items()}
    others = batch["mask"] == 0
    changed = {key: value.clone() for key, value in batch.items() if key != "obs"}
    changed["obs"] = batch["obs"]
    changed["actions"][others] = 1 - changed["actions"][others]
    changed["log_probs"][others] -= 3.0
    changed["values"][others] += 5.0
    changed["rewards"][others] -= 7.0
    results = []
    for mb in (batch, changed):
        model.load_state_dict(state)
        optimizer = make_optimizer(model, 0.01, cfg)
        mb = dict(mb, bootstrap=bootstrap_values(model, mb))
        advantages, targets = gae(mb["rewards"], mb["dones"], mb["values"], mb["bootstrap"], hp.gamma,
                                  hp.gae_lambda)
        stats = dict(zip(UPDATE_FIELDS, train_step(model, optimizer, cfg, hp, mb, advantages, targets).tolist()))
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    for key in ("loss", "policy_loss", "value_loss", "entropy"):
        assert results[0][0][key] == pytest.approx(results[1][0][key], rel=1e-5, abs=1e-6), key
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, atol=1e-6)
