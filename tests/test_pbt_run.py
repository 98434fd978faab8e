"""Population-based training end to end: the real trainer's processes, a tiny period, a resume."""

import glob
import json
import os
import struct

import pytest
from tensorboardX.proto import event_pb2

pytestmark = pytest.mark.slow  # every test here starts a trainer or trains

PBT = ["--env=CartPole-v1", "--experiment=pbt", "--num_policies=3", "--with_pbt=True", "--num_workers=2",
       "--num_envs_per_worker=6", "--worker_num_splits=3", "--report_interval=1", "--stats_avg=10",
       "--pbt_period_env_steps=4000", "--pbt_start_mutation=4000", "--pbt_mutation_rate=1.0",
       "--pbt_replace_reward_gap=0", "--pbt_replace_reward_gap_absolute=0", "--pbt_replace_confidence=0",
       "--batch_size=512",
       "--decorrelate_envs_on_one_worker=False", "--experiment_summaries_interval=1"]


def scalar_tags(summary_dir: str) -> dict[str, list[float]]:
    """Every scalar written to the tensorboard event files of a folder (TFRecord framing, Event protos)."""
    values: dict[str, list[float]] = {}
    for path in glob.glob(os.path.join(summary_dir, "events.out.tfevents.*")):
        with open(path, "rb") as f:
            data = f.read()
        offset = 0
        while offset + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                values.setdefault(value.tag, []).append(value.simple_value)
    return values


def history(exp_dir: str) -> list[dict]:
    with open(os.path.join(exp_dir, "pbt", "history.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.timeout(150)
def test_pbt_replaces_and_mutates_and_survives_a_resume(trainer):
    result = trainer.run(*PBT, "--train_for_env_steps=60000", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    exp_dir = os.path.join(trainer.train_dir, "pbt")
    events = history(exp_dir)
    replaced = [e for e in events if e["kind"] == "replace"]
    # With every gap at 0 a bottom policy always has a leader to take over, so it explores from the leader's values
    # ("replace"); exploring alone ("mutate", nobody far enough ahead) is pinned by tests/test_pbt.py.
    assert replaced
    for event in replaced:  # a bottom policy took a better one's weights, and the learner did it
        assert event["objectives"][event["donor"]] > event["objectives"][event["policy"]]
        assert f"PBT: policy {event['policy']} ({event['env_steps']} env steps" in result.stdout
    assert "took over the weights and optimizer state of policy" in result.stdout
    assert "PBT objective best" in result.stdout

    with open(os.path.join(exp_dir, "pbt", "population.json")) as f:
        saved = json.load(f)["policies"]
    for p, member in enumerate(saved):  # tensorboard has each policy's current learning rate
        rates = scalar_tags(os.path.join(exp_dir, "summaries", str(p)))["pbt/learning_rate"]
        assert rates[-1] == pytest.approx(member["hyperparams"]["learning_rate"], rel=1e-6)
    changed = [p for p, m in enumerate(saved) if m["hyperparams"]["learning_rate"] != 1e-3]
    assert changed, "mutation rate 1 must have moved some learning rate"

    # Resume: the same population goes on; no decision fires before a policy's period is up again.
    os.remove(os.path.join(exp_dir, "done"))  # as the trainer tells a user who wants to train further
    again = trainer.run(*PBT, "--train_for_env_steps=90000", timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("resumed from") == 3
    later = history(exp_dir)[len(events):]
    assert later, "the resumed run made PBT decisions too"
    for event in later:
        member = saved[event["policy"]]
        assert event["env_steps"] - member["last_decision_env_steps"] >= 4000
    first_after = {}
    for event in later:
        first_after.setdefault(event["policy"], event)
    for p, event in first_after.items():
        assert event["hyperparams_before"] == saved[p]["hyperparams"]


@pytest.mark.timeout(90)
def test_pbt_ranks_a_zero_sum_game_by_elo(trainer):
    """In the duel every return averages 0 whoever wins; ranked by Elo, PBT still tells the policies apart."""
    result = trainer.run("--env=duel", "--experiment=elo", "--num_policies=2", "--with_pbt=True",
                         "--pbt_target_objective=elo", "--pbt_period_env_steps=10000", "--pbt_start_mutation=0",
                         "--stats_avg=10", "--report_interval=2", "--train_for_seconds=20", timeout=80)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "PBT objective: Elo (ratings below)" in result.stdout
    decisions = history(os.path.join(trainer.train_dir, "elo"))
    assert len(decisions) >= 4, result.stdout[-3000:]
    for decision in decisions:  # every policy judged had played 10 rated games: ranked by its Elo (ratings start
        judged = [value for value in decision["objectives"] if value is not None]  # at 1000), never by a duel return,
        assert judged and all(value > 100 for value in judged), decision["objectives"]  # which is within [-3, 3]
    assert any(len({round(v, 3) for v in d["objectives"] if v is not None}) > 1 for d in decisions)


@pytest.mark.timeout(60)
def test_the_elo_objective_needs_games_between_policies(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=elo1", "--num_policies=2", "--with_pbt=True",
                         "--pbt_target_objective=elo", timeout=60)
    assert result.returncode == 2
    assert "--pbt_target_objective=elo ranks policies by the games they play against each other: " \
           "--env=CartPole-v1 has one agent" in result.stderr
