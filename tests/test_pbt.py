"""Population-based training apart from the processes: the decisions (pure functions), persistence, and
the learner's side (hyper-parameters, taking over another policy) driven in-process with real buffers."""

import dataclasses
import json
import os
import random

import pytest
import torch

from appo.config.cfg import make_config
from appo.config.hyperparams import Hyperparams
from appo.learning.checkpoint import latest_checkpoint, parse_name
from appo.messages import AdoptWeights, ExportWeights, SetHyperparams
from appo.population import pbt


def settings(**overrides) -> pbt.Settings:
    values = dict(period_env_steps=1000, start_mutation=0, replace_fraction=0.3, mutation_rate=1.0,
                  replace_reward_gap=0.1, replace_reward_gap_absolute=1e-6, perturb_min=1.2, perturb_max=2.0)
    return pbt.Settings(**{**values, **overrides})


def members(n: int) -> list[pbt.Member]:
    return [pbt.Member({"learning_rate": 1e-3, "gae_lambda": 0.95}, {"bonus": 0.0}) for _ in range(n)]


# ---------------------------------------------------------------- ranking and the gap rule
def test_gap_rule_for_positive_returns():
    assert pbt.replacement_gap_met(100.0, 50.0, relative=0.1, absolute=0.0)
    assert not pbt.replacement_gap_met(100.0, 95.0, relative=0.1, absolute=0.0)
    assert not pbt.replacement_gap_met(100.0, 50.0, relative=0.1, absolute=60.0)


def test_gap_rule_for_negative_and_mixed_returns():
    # Pendulum-like returns: -150 is clearly better than -1200, -1000 is hardly better than -1050.
    assert pbt.replacement_gap_met(-150.0, -1200.0, relative=0.1, absolute=0.0)
    assert not pbt.replacement_gap_met(-1000.0, -1050.0, relative=0.1, absolute=0.0)
    assert pbt.replacement_gap_met(1.0, -1.0, relative=0.1, absolute=0.0)
    # Never when the "worse" policy is in fact as good or better, whatever the signs.
    for best, worst in [(-100.0, -100.0), (-100.0, -90.0), (0.0, 0.0), (5.0, 6.0)]:
        assert not pbt.replacement_gap_met(best, worst, relative=0.1, absolute=0.0)


def test_only_bottom_policies_are_replaced_and_only_by_top_ones():
    objectives = [10.0, 400.0, 200.0, 30.0, 300.0]  # ranking 1, 4, 2, 3, 0; k = 2
    events = pbt.decide([5000] * 5, objectives, members(5), settings(), random.Random(0))
    kinds = {e.policy: e.kind for e in events}
    assert kinds == {1: "keep", 4: "keep", 2: "mutate", 3: "replace", 0: "replace"}
    for event in events:
        if event.kind == "replace":
            assert event.donor in (1, 4)


def test_negative_returns_rank_by_value_not_magnitude():
    objectives = [-1500.0, -200.0, -900.0]
    events = pbt.decide([5000] * 3, objectives, members(3), settings(), random.Random(0))
    by_policy = {e.policy: e for e in events}
    assert by_policy[1].kind == "keep"
    assert by_policy[0].kind == "replace" and by_policy[0].donor == 1
    assert by_policy[2].kind == "mutate"


def test_no_replacement_when_the_gap_is_small():
    events = pbt.decide([5000] * 2, [100.0, 99.0], members(2), settings(), random.Random(0))
    assert [e.kind for e in sorted(events, key=lambda e: e.policy)] == ["keep", "mutate"]


def test_equal_objectives_rank_in_random_order():
    kept = set()
    for seed in range(20):  # a sparse objective: 0 for every policy
        events = pbt.decide([5000] * 3, [0.0, 0.0, 0.0], members(3), settings(), random.Random(seed))
        kept |= {e.policy for e in events if e.kind == "keep"}
        assert not any(e.kind == "replace" for e in events)  # no gap, no replacement
    assert kept == {0, 1, 2}


@pytest.mark.parametrize("n, expected", [(2, 1), (3, 1), (4, 2), (5, 2), (6, 2), (7, 3), (8, 3)])
def test_how_many_policies_are_replaced(n, expected):
    assert pbt.replace_count(n, 0.3) == expected
    objectives = [float(100 * (p + 1)) for p in range(n)]  # all far apart
    events = pbt.decide([5000] * n, objectives, members(n), settings(), random.Random(1))
    assert sum(e.kind == "replace" for e in events) == expected
    assert sum(e.kind == "keep" for e in events) == expected
    assert {e.policy for e in events if e.kind == "replace"} == set(range(expected))  # the lowest objectives


def test_policies_are_judged_once_per_period_after_the_start_and_only_with_data():
    population = members(3)
    s = settings(period_env_steps=1000, start_mutation=3000)
    assert pbt.decide([2500] * 3, [1.0, 2.0, 3.0], population, s, random.Random(0)) == []  # before the start
    assert [e.policy for e in pbt.decide([3000, 3000, 3000], [1.0, None, 3.0], population, s,
                                         random.Random(0))] == [0, 2]  # policy 1 has too few episodes
    for event in pbt.decide([3000] * 3, [1.0, 2.0, 3.0], population, s, random.Random(0)):
        pbt.apply(population, event)
    assert pbt.decide([3900] * 3, [1.0, 2.0, 3.0], population, s, random.Random(0)) == []  # period not up
    assert len(pbt.decide([4000] * 3, [1.0, 2.0, 3.0], population, s, random.Random(0))) == 3


def test_apply_copies_the_donors_values_then_explores():
    population = members(2)
    population[1].hyperparams["learning_rate"] = 0.02
    events = pbt.decide([5000, 5000], [0.0, 50.0], population, settings(mutation_rate=0.0), random.Random(0))
    replace = next(e for e in events if e.kind == "replace")
    pbt.apply(population, replace)
    assert population[0].hyperparams == population[1].hyperparams  # no mutation at rate 0
    assert population[0].replacements == 1 and population[0].last_decision_env_steps == 5000
    assert "takes over policy 1" in replace.describe()


# ---------------------------------------------------------------- mutation
def test_perturbations_stay_within_bounds_and_factors():
    rng = random.Random(0)
    for name, bounds in pbt.MUTABLE.items():
        value = (bounds.low + bounds.high) / 2
        for _ in range(300):
            new = pbt.perturb(value, bounds, rng, 1.2, 2.0)
            assert bounds.low <= new <= bounds.high, name
            if not bounds.discount_like and bounds.low < new < bounds.high:
                assert 1.2 - 1e-9 <= max(new / value, value / new) <= 2.0 + 1e-9
            value = new


def test_zero_can_move():
    rng = random.Random(0)
    bounds = pbt.MUTABLE["exploration_loss_coeff"]
    moved = {pbt.perturb(0.0, bounds, rng, 1.2, 2.0) for _ in range(20)}
    assert all(v > 0 for v in moved)
    assert all(bounds.from_zero / 2.0 - 1e-12 <= v <= bounds.from_zero * 2.0 + 1e-12 for v in moved)


def test_discount_like_values_move_on_one_minus_x():
    rng = random.Random(0)
    bounds = pbt.MUTABLE["gamma"]
    for _ in range(200):
        new = pbt.perturb(0.99, bounds, rng, 1.2, 2.0)
        ratio = (1 - new) / (1 - 0.99)
        assert 1.2 - 1e-6 <= max(ratio, 1 / ratio) <= 2.0 + 1e-6
        assert new < 1.0
    # 1 - x = 0 (lambda = 1) still moves, to just below 1.
    lam = pbt.perturb(1.0, pbt.MUTABLE["gae_lambda"], rng, 1.2, 2.0)
    assert 0.99 < lam < 1.0


def test_mutation_rate_is_the_chance_of_each_value_moving():
    rng = random.Random(0)
    values = {f"v{i}": 1.0 for i in range(2000)}
    explored = pbt.explore(values, {}, rng, settings(mutation_rate=0.3), pbt.SHAPING_BOUNDS)
    moved = sum(explored[k] != 1.0 for k in values) / len(values)
    assert 0.25 < moved < 0.35


def test_pbt_mutates_exactly_the_fields_of_hyperparams():
    assert tuple(pbt.MUTABLE) == Hyperparams.names()


def test_hyperparams_start_from_the_flags_and_change_only_by_copy():
    cfg = make_config(env="CartPole-v1", learning_rate=1e-5, gamma=0.9)
    flags = Hyperparams.from_cfg(cfg)
    assert (flags.learning_rate, flags.gamma, flags.max_grad_norm) == (1e-5, 0.9, cfg.max_grad_norm)
    changed = flags.updated({"learning_rate": 0.01})
    assert changed.learning_rate == 0.01 and flags.learning_rate == 1e-5 and changed.gamma == 0.9
    assert changed.as_dict() == {**flags.as_dict(), "learning_rate": 0.01}
    with pytest.raises(ValueError, match="not a hyper-parameter PBT may change: rollout"):
        flags.updated({"rollout": 8})


def test_gamma_is_mutated_only_when_asked_and_grad_norm_only_when_clipping():
    cfg = make_config(env="CartPole-v1")
    assert "gamma" not in pbt.mutable_names(cfg) and "max_grad_norm" in pbt.mutable_names(cfg)
    cfg = dataclasses.replace(cfg, pbt_optimize_gamma=True, max_grad_norm=0.0)
    assert "gamma" in pbt.mutable_names(cfg) and "max_grad_norm" not in pbt.mutable_names(cfg)


# ---------------------------------------------------------------- persistence
def test_population_round_trip_and_history(tmp_path):
    exp_dir = str(tmp_path)
    cfg = make_config(env="CartPole-v1", num_policies=2, learning_rate=1e-5)
    population = pbt.restore_population(exp_dir, cfg, {"bonus": 0.1}, {}, random.Random(0))
    assert population[0].hyperparams["learning_rate"] == 1e-5 and population[1].shaping == {"bonus": 0.1}
    events = pbt.decide([5000, 5000], [0.0, 50.0], population, settings(), random.Random(0))
    for event in events:
        pbt.apply(population, event)
        pbt.append_history(exp_dir, event)
    pbt.save_population(exp_dir, population)

    cfg = dataclasses.replace(cfg, pbt_optimize_gamma=True)  # a value the saved file lacks comes from the flags
    restored = pbt.restore_population(exp_dir, cfg, {"bonus": 0.1}, {"bonus": pbt.Bounds(0.1, 10, 0.1)},
                                      random.Random(0))  # a saved population is not spread again
    for saved, loaded in zip(population, restored):
        assert {k: v for k, v in loaded.hyperparams.items() if k != "gamma"} == saved.hyperparams
        assert loaded.hyperparams["gamma"] == cfg.gamma
        assert (loaded.shaping, loaded.last_decision_env_steps, loaded.replacements) == \
            (saved.shaping, saved.last_decision_env_steps, saved.replacements)
    with open(os.path.join(exp_dir, "pbt", "history.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert [line["kind"] for line in lines] == [e.kind for e in events]
    assert {"time", "env_steps", "policy", "donor", "objectives", "hyperparams_before", "hyperparams_after"} <= \
        set(lines[0])


def test_initial_population_spreads_only_declared_shaping():
    cfg = make_config(env="CartPole-v1", num_policies=8, learning_rate=1e-5)
    bounds = pbt.shaping_bounds({"bonus": (0.1, 10.0), "signed": (-1.0, 1.0)})
    shaping = {"bonus": 0.3, "signed": 0.0, "fixed": 2.0}
    population = pbt.initial_members(cfg, 8, shaping, bounds, random.Random(0))
    assert population[0].shaping == shaping  # policy 0 keeps the env's values
    assert all(m.hyperparams == population[0].hyperparams for m in population)  # the flags' values, for everyone
    assert all(m.hyperparams["learning_rate"] == 1e-5 for m in population)
    bonuses = [m.shaping["bonus"] for m in population[1:]]
    assert all(0.1 <= b <= 10.0 for b in bonuses) and len(set(bonuses)) == 7
    assert any(b < 1.0 for b in bonuses) and any(b > 1.0 for b in bonuses)
    assert all(-1.0 <= m.shaping["signed"] <= 1.0 for m in population)
    assert all(m.shaping["fixed"] == 2.0 for m in population)  # no declared range: not spread
    # Log-uniform over [0.1, 10]: about half the draws below 1.
    many = pbt.initial_members(cfg, 2001, {"bonus": 0.3}, bounds, random.Random(1))[1:]
    assert 0.45 < sum(m.shaping["bonus"] < 1.0 for m in many) / 2000 < 0.55


def test_corrupt_or_mismatched_population_is_refused(tmp_path):
    exp_dir = str(tmp_path)
    pbt.save_population(exp_dir, members(3))
    with pytest.raises(ValueError, match="--num_policies=2"):
        pbt.load_population(exp_dir, 2)
    with open(os.path.join(exp_dir, "pbt", "population.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(ValueError, match="corrupt PBT population file"):
        pbt.load_population(exp_dir, 3)


# ---------------------------------------------------------------- the learner's side, in-process
def fill(traj, slots: list[int], policy: int, version: int) -> None:
    traj.policy_ids[slots] = policy
    traj.policy_versions[slots] = version


def test_a_new_learning_rate_is_in_the_optimizer_after_the_next_iteration(learners, learner_rig):
    (learner, _), traj = learners
    slots = list(range(learner.trajs_per_iteration))
    fill(traj, slots, 0, 0)
    learner.on_message(SetHyperparams({"learning_rate": 0.0123, "ppo_clip_ratio": 0.3}))
    before = [p.detach().clone() for p in learner.policy.model.parameters()]
    learner.train_iteration(slots)
    assert learner.policy.optimizer.param_groups[0]["lr"] == 0.0123
    assert learner.policy.hyperparams.ppo_clip_ratio == 0.3 and learner_rig.cfg.ppo_clip_ratio == 0.1  # flags stay
    assert not hasattr(learner.cfg, "ppo_clip_ratio")  # the learner reads it from its policy's Hyperparams only
    assert learner.policy.version == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.policy.model.parameters()))


def test_after_a_copy_donor_and_receiver_act_alike_and_versions_still_increase(learners):
    (donor, receiver), traj = learners
    slots = list(range(donor.trajs_per_iteration))
    for _ in range(3):  # the donor trains ahead of the receiver
        fill(traj, slots, 0, donor.policy.version)
        donor.train_iteration(slots)
    fill(traj, slots, 1, 0)
    receiver.train_iteration(slots)
    receiver.on_message(SetHyperparams({"learning_rate": 0.005}))
    batch = {"obs": torch.randn(16, 4)}
    rnn = torch.zeros(16, 1)
    assert not torch.allclose(donor.policy.model.forward_step(batch, rnn)[0],
                              receiver.policy.model.forward_step(batch, rnn)[0])

    version_before = receiver.policy.version
    donor.on_message(ExportWeights(1))
    (message,) = receiver.inbox.get_many(timeout=1)
    assert isinstance(message, AdoptWeights) and (message.donor, message.version) == (0, donor.policy.version)
    receiver.on_message(message)
    with torch.no_grad():
        for a, b in zip(donor.policy.model.forward_step(batch, rnn), receiver.policy.model.forward_step(batch, rnn)):
            assert torch.equal(a, b)
    assert receiver.policy.version == version_before + 1
    assert receiver.policy.optimizer.param_groups[0]["lr"] == 0.005  # its own (mutated) hyper-parameters
    assert os.listdir(pbt.pbt_dir(receiver.exp_dir)) == []  # the transfer file is consumed
    assert parse_name(latest_checkpoint(receiver.checkpoint_dir))[0] == receiver.policy.version  # resume keeps it

    # Trajectories sampled by the replaced weights are never trained on; fresh ones are.
    fill(traj, slots, 1, version_before)
    dropped = receiver.counters.dropped
    receiver.train_iteration(slots)
    assert receiver.counters.dropped == dropped + len(slots) and receiver.policy.version == version_before + 1
    fill(traj, slots, 1, receiver.policy.version)
    receiver.train_iteration(slots)
    assert receiver.policy.version == version_before + 2
