"""Population-based training apart from the processes: the decisions (pure functions), persistence, and
the learner's side (hyper-parameters, taking over another policy) driven in-process with real buffers."""

import dataclasses
import json
import os
import random
import statistics

import pytest
import torch

from appo.config.cfg import make_config, parse_config
from appo.config.hyperparams import Hyperparams
from appo.learning.checkpoint import latest_checkpoint, parse_name
from appo.messages import ActorReport, AdoptWeights, EpisodeEnd, ExportWeights, SetHyperparams
from appo.population import pbt
from appo.run.reporting import Reports


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


def test_only_bottom_policies_are_replaced_and_only_by_top_ones_and_the_middle_keeps():
    objectives = [10.0, 400.0, 200.0, 30.0, 300.0]  # ranking 1, 4, 2, 3, 0; k = 2
    events = pbt.decide([5000] * 5, objectives, members(5), settings(), random.Random(0))
    kinds = {e.policy: e.kind for e in events}
    assert kinds == {1: "keep", 4: "keep", 2: "keep", 3: "replace", 0: "replace"}
    for event in events:
        if event.kind == "replace":
            assert event.donor in (1, 4)


def test_negative_returns_rank_by_value_not_magnitude():
    objectives = [-1500.0, -200.0, -900.0]
    events = pbt.decide([5000] * 3, objectives, members(3), settings(), random.Random(0))
    by_policy = {e.policy: e for e in events}
    assert by_policy[1].kind == "keep"
    assert by_policy[0].kind == "replace" and by_policy[0].donor == 1
    assert by_policy[2].kind == "keep"  # the middle


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
    assert sum(e.kind == "keep" for e in events) == n - expected  # the top and the middle
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
    donor = {**population[1].hyperparams, **population[1].shaping}
    receiver = {**population[0].hyperparams, **population[0].shaping}
    assert sum(receiver[k] != donor[k] for k in donor) == 1  # the donor's values, but for the one explore moved
    assert population[0].replacements == 1 and population[0].last_decision_env_steps == 5000
    assert "takes over policy 1" in replace.describe()


def test_a_flat_bottom_explores_from_its_own_values():
    population = members(4)
    for p, member in enumerate(population):
        member.hyperparams["learning_rate"] = 1e-3 * (p + 1)
    events = pbt.decide([5000] * 4, [10.0, 10.0, 10.0, 10.0], population, settings(), random.Random(0))
    mutated = [e for e in events if e.kind == "mutate"]
    assert len(mutated) == 2 and not any(e.kind == "replace" for e in events)  # nobody ahead; the bottom still moves
    for event in mutated:
        assert event.hyperparams_before == population[event.policy].hyperparams
        assert event.hyperparams_after != event.hyperparams_before


def test_a_lead_within_the_noise_replaces_nobody():
    assert pbt.difference_error([3.0, None, 4.0]) == pytest.approx(5.0)
    assert pbt.difference_error([None, None]) == 0.0
    assert pbt.replacement_gap_met(100.0, 80.0, 0.1, 0.0, noise=18.0)
    assert not pbt.replacement_gap_met(100.0, 80.0, 0.1, 0.0, noise=22.0)
    objectives = [100.0, 80.0]
    cases = [([15.0, 15.0], "mutate"), ([1.0, 1.0], "replace"), ([None, None], "replace"), (None, "replace"),
             ([None, 9.0], "replace"), ([None, 11.0], "mutate")]  # the gap is 20: replaced when 2 se are below it
    for errors, kind in cases:
        events = pbt.decide([5000] * 2, objectives, members(2), settings(replace_confidence=2.0), random.Random(0),
                            errors)
        assert next(e.kind for e in events if e.policy == 1) == kind, errors


def test_elo_ratings_are_replaced_by_a_gap_in_rating_points_at_any_level():
    """Ratings have no natural zero: a lead means the same at 1000 as at 2000, so it decides alone."""
    assert pbt.Settings.from_cfg(make_config(env="CartPole-v1")).replace_elo_gap is None
    elo = pbt.Settings.from_cfg(make_config(num_agents=2, env="duel", pbt_target_objective="elo"))
    assert elo.replace_elo_gap == 100.0
    for lead, kind in ((90.0, "mutate"), (150.0, "replace")):
        for level in (-300.0, 1000.0, 2000.0):
            events = pbt.decide([50_000] * 2, [level + lead, level], members(2), elo, random.Random(0))
            assert next(e.kind for e in events if e.policy == 1) == kind, (level, lead)


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


def test_an_explore_always_moves_one_value_chosen_uniformly():
    rng = random.Random(0)
    values = {f"v{i}": 1.0 for i in range(4)}
    counts = dict.fromkeys(values, 0)
    for _ in range(4000):
        explored = pbt.explore(values, {}, rng, settings(mutation_rate=0.0), pbt.SHAPING_BOUNDS)
        moved = [k for k in values if explored[k] != 1.0]
        assert len(moved) == 1
        counts[moved[0]] += 1
    assert all(900 < c < 1100 for c in counts.values())
    assert pbt.explore({}, {}, rng, settings(mutation_rate=0.0)) == {}


def test_one_explore_covers_hyperparameters_and_shaping_together():
    rng = random.Random(0)
    member = pbt.Member({"learning_rate": 1e-3, "gae_lambda": 0.95}, {"bonus": 1.0})
    moved_shaping = 0
    for _ in range(600):
        hyperparams, shaping = pbt.explore_member(member, settings(mutation_rate=0.0), rng)
        before, after = {**member.hyperparams, **member.shaping}, {**hyperparams, **shaping}
        assert set(after) == set(before) and sum(after[k] != before[k] for k in before) == 1
        moved_shaping += shaping["bonus"] != 1.0
    assert 150 < moved_shaping < 250  # one value in three


def test_every_hyperparameter_has_a_prior_within_its_hard_bounds():
    for name, b in pbt.MUTABLE.items():
        assert b.prior is not None and b.low <= b.prior[0] < b.prior[1] <= b.high, name
    # Hard bounds where a member stops learning (issue 26).
    assert pbt.MUTABLE["gae_lambda"].low == 0.8
    assert (pbt.MUTABLE["ppo_clip_ratio"].low, pbt.MUTABLE["ppo_clip_ratio"].high) == (0.02, 0.5)


def test_priors_are_drawn_log_uniformly_and_on_one_minus_x_for_discounts():
    rng = random.Random(0)
    lr = [pbt.draw_from_prior(pbt.MUTABLE["learning_rate"], rng) for _ in range(4000)]
    assert all(1e-4 <= v <= 3e-3 for v in lr)
    assert 0.45 < sum(v < (1e-4 * 3e-3) ** 0.5 for v in lr) / len(lr) < 0.55  # half below the geometric middle
    lam = [pbt.draw_from_prior(pbt.MUTABLE["gae_lambda"], rng) for _ in range(4000)]
    assert all(0.9 <= v <= 0.99 for v in lam)
    assert 0.45 < sum(1 - v < (0.1 * 0.01) ** 0.5 for v in lam) / len(lam) < 0.55
    signed = [pbt.draw_from_prior(pbt.shaping_bounds({"s": (-1.0, 1.0)})["s"], rng) for _ in range(4000)]
    assert all(-1 <= v <= 1 for v in signed) and 0.45 < sum(v < 0 for v in signed) / len(signed) < 0.55


def test_a_chosen_value_is_resampled_with_the_resample_probability():
    rng = random.Random(0)
    far_off = {"learning_rate": 1e-6}  # 100x below the prior: a perturbation stays below 2e-6
    s = settings(mutation_rate=1.0, resample_probability=0.25)
    drawn = [pbt.explore(far_off, pbt.MUTABLE, rng, s)["learning_rate"] for _ in range(4000)]
    resampled = [v for v in drawn if v >= 1e-4]
    assert 0.22 < len(resampled) / len(drawn) < 0.28 and all(v <= 3e-3 for v in resampled)
    assert all(1e-6 / 2.0 - 1e-15 <= v <= 1e-6 * 2.0 + 1e-15 for v in drawn if v < 1e-4)  # the rest perturbed
    never = settings(mutation_rate=1.0, resample_probability=0.0)
    assert all(pbt.explore(far_off, pbt.MUTABLE, rng, never)["learning_rate"] < 1e-4 for _ in range(500))


def test_shaping_is_resampled_only_within_a_declared_range():
    rng = random.Random(0)
    always = settings(mutation_rate=1.0, resample_probability=1.0)
    for _ in range(300):  # no declared range: perturbed only
        ratio = pbt.explore({"bonus": 5.0}, {}, rng, always, pbt.SHAPING_BOUNDS)["bonus"] / 5.0
        assert 1.2 - 1e-9 <= max(ratio, 1 / ratio) <= 2.0 + 1e-9
    declared = pbt.shaping_bounds({"bonus": (0.1, 10.0)})
    drawn = [pbt.explore({"bonus": 5.0}, declared, rng, always)["bonus"] for _ in range(2000)]
    assert all(0.1 <= v <= 10.0 for v in drawn) and 0.45 < sum(v < 1.0 for v in drawn) / len(drawn) < 0.55


def test_hard_bounds_hold_whatever_the_start_and_the_move():
    rng = random.Random(0)
    s = settings(mutation_rate=1.0, resample_probability=0.3, perturb_min=1.5, perturb_max=4.0)
    values = {"gae_lambda": 0.5, "ppo_clip_ratio": 0.01}  # a start outside the bounds is brought inside
    for _ in range(500):
        values = pbt.explore(values, pbt.MUTABLE, rng, s)
        assert 0.8 <= values["gae_lambda"] <= 1.0 and 0.02 <= values["ppo_clip_ratio"] <= 0.5


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


def test_gamma_is_mutated_only_when_asked_and_a_zero_that_is_a_choice_is_left_alone():
    cfg = make_config(env="CartPole-v1")
    names = pbt.mutable_names(cfg)
    assert "gamma" not in names and "max_grad_norm" in names and "exploration_loss_coeff" in names
    cfg = dataclasses.replace(cfg, pbt_optimize_gamma=True, max_grad_norm=0.0, exploration_loss_coeff=0.0)
    names = pbt.mutable_names(cfg)
    assert "gamma" in names and "max_grad_norm" not in names and "exploration_loss_coeff" not in names


def test_the_objectives_standard_error_is_over_the_full_window(tmp_path):
    cfg = parse_config(["--env=CartPole-v1", "--num_workers=1", "--num_policies=1", "--stats_avg=4"])
    reports = Reports(cfg, str(tmp_path), [0])

    def episodes(objectives: list[float]) -> ActorReport:
        return ActorReport(worker=0, env_steps=0, episodes=[EpisodeEnd(0, 0.0, 10, o, {}) for o in objectives],
                           games=[], timing={}, env_errors=0, illegal_actions=0, nonfinite=0, state="stepping",
                           every_env_ended=True)

    reports.on_actor(episodes([1.0, 2.0, 3.0]))
    assert reports.objective_error(0) is None  # no full window yet
    reports.on_actor(episodes([100.0, 2.0, 4.0, 6.0, 8.0]))  # the window: 2, 4, 6, 8
    assert reports.objective(0) == 5.0
    assert reports.objective_error(0) == pytest.approx(statistics.stdev([2, 4, 6, 8]) / 2)
    one = Reports(parse_config(["--env=CartPole-v1", "--num_workers=1", "--num_policies=1", "--stats_avg=1"]),
                  str(tmp_path), [0])
    one.on_actor(episodes([3.0]))
    assert one.objective(0) == 3.0 and one.objective_error(0) is None  # one episode: no spread to measure


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
    restored = pbt.restore_population(exp_dir, cfg, {"bonus": 0.1}, pbt.shaping_bounds({"bonus": (0.1, 10)}),
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
