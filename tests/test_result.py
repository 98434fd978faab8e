"""appo/run/result.py: a finished run's result.json read back as a `RunResult` (the one reader of a run's numbers)."""

import json

import pytest

from appo.run.result import RunResult, read_result
from appo.run.stopping import TargetReached

WRITTEN = {"reason": "target reward 475 reached by p1 (mean 480.00 of 100) at 12.5 s, 30000 env steps",
           "completed": True, "failed": False, "env_steps": 31000, "seconds": 11.25,
           "stats": {"0": {"reward": 300.5, "length": 300.5, "episodes": 100},
                     "1": {"reward": 480.0, "length": 480.0, "episodes": 100, "objective": 0.9}},
           "best_rewards": {"0": 310.0, "1": None},
           "checkpoints": {"0": "train_dir/x/checkpoint_p0/checkpoint_000000012_00015000.pt", "1": None},
           "target": {"measure": "reward", "target": 475.0, "policy": 1, "mean": 480.0, "env_steps": 30000,
                      "seconds": 12.5}}


def test_a_hand_written_result_json_is_read(tmp_path):
    (tmp_path / "result.json").write_text(json.dumps(WRITTEN))
    result = read_result(str(tmp_path))
    assert result.completed and not result.failed and result.reason.startswith("target reward 475 reached")
    assert (result.env_steps, result.seconds) == (31000, 11.25)
    assert result.final_reward() == 300.5 and result.final_reward(1) == 480.0 and result.final_reward(2) is None
    assert result.best_reward(0) == 310.0 and result.best_reward(1) == 480.0  # no full window: the final mean
    assert result.stats[1]["objective"] == 0.9 and result.stats[0]["episodes"] == 100
    assert result.checkpoint == WRITTEN["checkpoints"]["0"] and result.checkpoints[1] is None
    assert result.target == TargetReached("reward", 475.0, 1, 480.0, 30000, 12.5)
    assert RunResult.from_dict(result.to_dict()) == result  # what launch.py writes reads back the same


def test_a_result_without_checkpoints_and_without_a_target_reads(tmp_path):
    older = {key: value for key, value in WRITTEN.items() if key != "checkpoints"}
    (tmp_path / "result.json").write_text(json.dumps({**older, "target": None, "stats": {}}))
    result = read_result(str(tmp_path))
    assert result.checkpoints == {} and result.checkpoint is None and result.target is None
    assert result.final_reward() is None


def test_no_result_or_another_file_is_an_error(tmp_path):
    with pytest.raises(OSError):
        read_result(str(tmp_path))
    (tmp_path / "result.json").write_text(json.dumps({"reason": "interrupted"}))
    with pytest.raises(ValueError, match="not a run's result"):
        read_result(str(tmp_path))
