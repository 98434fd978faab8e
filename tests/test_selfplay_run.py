"""Self-play and policy mapping end to end: the real trainer's processes on the built-in duel and on the
cooperative ring."""

import glob
import json
import os

import pytest
import torch

from appo.learning.checkpoint import latest_checkpoint
from tests.test_pbt_run import scalar_tags

pytestmark = pytest.mark.slow  # every test here starts a trainer or trains

SELF_PLAY = ["--env=duel", "--experiment=sp", "--self_play_opponents=2", "--self_play_snapshot_every=2",
             "--self_play_latest_fraction=0.0", "--num_workers=1", "--num_envs_per_worker=8", "--batch_size=256",
             "--train_for_env_steps=60000", "--seed=1", "--report_interval=1", "--experiment_summaries_interval=1"]


@pytest.mark.timeout(150)
def test_self_play_rates_a_zero_sum_game_and_saves_the_pool(trainer):
    result = trainer.run(*SELF_PLAY, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert output.count("joins the self-play pool") == 1  # the first snapshot; the status line shows the rest
    assert "ratings: p0 Elo" in output  # the status line
    assert "Elo: p0 " in output and " vs p0@v" in output  # the final table

    exp_dir = os.path.join(trainer.train_dir, "sp")
    with open(os.path.join(exp_dir, "selfplay", "ratings.json")) as f:
        ratings = json.load(f)
    pairs = ratings["pairs"]["p0"]
    assert pairs and all(name.startswith("p0@v") for name in pairs)  # with fraction 0, only snapshots once any exist
    games = sum(record["wins"] + record["draws"] + record["losses"] for record in pairs.values())
    assert games >= 20
    for record in pairs.values():  # zero-sum: what one side won, the other lost
        assert record["score_sum"] + record["opponent_score_sum"] == pytest.approx(0.0, abs=1e-6)
    assert set(ratings["elo"]) >= {"p0", *pairs}

    checkpoint = torch.load(latest_checkpoint(os.path.join(exp_dir, "checkpoint_p0")), weights_only=False)
    versions = sorted(s["version"] for s in checkpoint["snapshots"])
    assert len(versions) == 2 and all(v % 2 == 0 for v in versions) and versions[-1] <= checkpoint["version"]

    tags = scalar_tags(os.path.join(exp_dir, "summaries", "0"))
    assert "selfplay/elo" in tags and "selfplay/win_rate_vs_snapshots" in tags
    assert glob.glob(os.path.join(exp_dir, "summaries", "0", "events.out.tfevents.*"))


@pytest.mark.timeout(120)
def test_user_mapping_puts_two_policies_in_every_game(trainer):
    result = trainer.run("--env=coop_multi_agent", "--experiment=mapped", "--num_policies=2",
                         "--policy_mapping=tests.user_mapping:one_of_each", "--num_workers=1",
                         "--num_envs_per_worker=4", "--batch_size=256", "--train_for_env_steps=20000", timeout=90)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    with open(os.path.join(trainer.train_dir, "mapped", "selfplay", "ratings.json")) as f:
        pairs = json.load(f)["pairs"]
    assert set(pairs) == {"p0", "p1"} and set(pairs["p0"]) == {"p1"}
    record = pairs["p0"]["p1"]
    assert record["wins"] + record["draws"] + record["losses"] >= 20
    assert record["draws"] == record["wins"] + record["draws"] + record["losses"]  # a team reward: always a draw
