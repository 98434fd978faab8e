"""Turn-based games end to end: the real trainer's processes learn connect four by self-play with an opponent pool and
Elo, with no illegal move; a mover without moves stops the run in one line; an exported masked policy acts as the
PyTorch one does."""

import json
import os

import numpy as np
import pytest
import torch

from appo.envs.classic_games import play_games, random_player
from appo.learning.trained_policy import load_policy
from appo.run.result import read_result
from appo.spaces import MASK_KEY
from appo.tools.versus import policy_player
from tests.test_pbt_run import history

pytestmark = pytest.mark.slow  # every test here starts a trainer

CONNECT_FOUR = "--env=pettingzoo.classic.connect_four_v3:env"


@pytest.mark.timeout(240)
def test_connect_four_self_play_beats_a_random_player_without_an_illegal_move(trainer):
    pytest.importorskip("pettingzoo")
    result = trainer.run(CONNECT_FOUR, "--experiment=c4", "--self_play_opponents=2", "--self_play_snapshot_every=20",
                         "--num_workers=1", "--train_for_env_steps=40000", "--seed=0", timeout=200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    exp_dir = os.path.join(trainer.train_dir, "c4")
    run = read_result(exp_dir)
    assert run.completed and run.faults["illegal_actions"] == 0
    with open(os.path.join(exp_dir, "selfplay", "ratings.json")) as f:
        ratings = json.load(f)
    assert "p0" in ratings["elo"] and ratings["pairs"]["p0"]  # games against the snapshots were rated
    record = play_games("connect_four", policy_player(exp_dir, "connect_four"), random_player, games=100, seed=1)
    assert record.illegal == 0 and record.win_rate >= 0.8, record  # an untrained policy wins about half


@pytest.mark.timeout(120)
def test_a_move_learns_the_result_of_the_reply_it_allows(trainer):
    """Take-away from 3 stones: the mover loses, whatever it takes, to an opponent who then takes the rest; from 2 it
    wins by taking both. The loss comes on the opponent's move, while the seat waits: it reaches the seat's own move
    before it (`losses.turn_gae`), so the value head learns 3 stones as a loss and 2 as a win."""
    result = trainer.run("--env=tests.turn_envs:take_away", "--env_kwargs={\"pile\": 3}", "--experiment=take3",
                         "--num_workers=1", "--train_for_env_steps=30000", "--seed=0", timeout=100)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    policy = load_policy(os.path.join(trainer.train_dir, "take3"))
    piles = {"observation": torch.tensor([[1.0], [2 / 3]]), MASK_KEY: torch.tensor([[1, 1], [1, 1]])}
    with torch.no_grad():
        params, values, _ = policy.model.forward_step(piles, torch.zeros(2, policy.model.state_size))
    assert values[0] < -0.5 and values[1] > 0.8, values
    assert torch.softmax(params[1], -1)[1] > 0.95


@pytest.mark.timeout(120)
def test_pbt_ranks_connect_four_policies_by_elo(trainer):
    """Every connect four return averages 0 whoever wins: PBT ranks the two policies by the Elo of their games."""
    pytest.importorskip("pettingzoo")
    result = trainer.run(CONNECT_FOUR, "--experiment=c4pbt", "--num_policies=2", "--with_pbt=True",
                         "--pbt_target_objective=elo", "--pbt_period_env_steps=5000", "--pbt_start_mutation=0",
                         "--stats_avg=10", "--num_workers=1", "--train_for_seconds=25", timeout=100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "PBT objective: Elo (ratings below)" in result.stdout
    decisions = history(os.path.join(trainer.train_dir, "c4pbt"))
    assert decisions, result.stdout[-3000:]
    for decision in decisions:  # ratings start at 1000; a connect four return is within [-1, 1]
        judged = [value for value in decision["objectives"] if value is not None]
        assert judged and all(value > 100 for value in judged), decision["objectives"]
    assert read_result(os.path.join(trainer.train_dir, "c4pbt")).faults["illegal_actions"] == 0


@pytest.mark.timeout(120)
def test_a_mover_whose_mask_allows_nothing_stops_the_run_in_one_line(trainer):
    result = trainer.run("--env=tests.turn_envs:take_away", "--env_kwargs={\"no_moves_at\": 3}", "--experiment=stuck",
                         "--num_workers=1", "--num_envs_per_worker=2", "--train_for_env_steps=5000", timeout=90)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    lines = [line for line in output.splitlines() if "allows no action" in line]
    assert lines and "--env=tests.turn_envs:take_away: second's turn at move 3 of a game" in lines[0], output[-3000:]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("flags", [[], ["--mirror_symmetry=True"]])
def test_an_exported_masked_policy_takes_the_actions_pytorch_takes(trainer, tmp_path, flags):
    pytest.importorskip("pettingzoo")
    pytest.importorskip("onnxruntime")
    import onnxruntime

    from appo.tools.export import export_policy

    result = trainer.run(CONNECT_FOUR, "--experiment=c4x", "--num_workers=1", "--train_for_env_steps=4000", *flags,
                         timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    policy = load_policy(os.path.join(trainer.train_dir, "c4x"))
    path = export_policy(policy, "onnx", str(tmp_path / "c4.onnx"))
    rng = np.random.default_rng(0)
    boards = rng.integers(0, 2, (256, 6, 7, 2)).astype(np.float32)
    masks = rng.integers(0, 2, (256, 7)).astype(np.float32)
    masks[np.arange(256), rng.integers(0, 7, 256)] = 1
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {MASK_KEY: masks, "observation": boards}
    params = session.run(["action_params"], {i.name: feeds[i.name] for i in session.get_inputs()})[0]
    onnx_actions = params.argmax(-1)
    torch_actions = np.array(policy.act({"observation": boards, MASK_KEY: masks}, deterministic=True))
    assert np.array_equal(onnx_actions, torch_actions)
    assert masks[np.arange(256), onnx_actions].all()  # every action allowed
    # The mask decides: the same boards with another mask give other, again allowed, actions.
    flipped = 1 - masks
    flipped[flipped.sum(-1) == 0, 0] = 1
    with torch.no_grad():
        again = policy.act({"observation": boards, MASK_KEY: flipped}, deterministic=True)
    assert flipped[np.arange(256), again].all() and not np.array_equal(again, torch_actions)
    if flags:  # the mirrored policy, exported, plays each board's mirror image in the mirrored column
        feeds = {MASK_KEY: masks[:, ::-1].copy(), "observation": boards[:, :, ::-1].copy()}
        params = session.run(["action_params"], {i.name: feeds[i.name] for i in session.get_inputs()})[0]
        ties = np.sort(params, -1)[:, -1] - np.sort(params, -1)[:, -2] < 1e-5  # a tie's argmax is the first column
        assert np.array_equal((6 - params.argmax(-1))[~ties], onnx_actions[~ties])
