"""The benchmark suite script on one short task: it trains, then writes its Markdown table and its PNG; the PBT
benchmark's pure parts: its table from records, resuming, its starts' flags."""

import json
import re
import signal
import subprocess
import sys

import pytest

from appo.config.auto import IMAGE_LEARNING
from appo.config.flags import Config
from tests.conftest import REPO, leaked_segments, shm_entries, wait_for
from tests.test_reporting import module


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_suite_runs_one_short_task(tmp_path):
    before = shm_entries()
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "scripts/suite.py", "--tasks", "cartpole", "--seeds", "1", "--budget_scale", "0.25",
         "--train_dir", str(tmp_path / "train_dir"), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=140)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    table = (out / "suite.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| cartpole |")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[1:4] == ["CartPole-v1", "475", "15 s"]
    solved, time_cell, steps_cell = cells[4:7]
    assert solved in ("0 of 1", "1 of 1")
    if solved == "1 of 1":  # then the time and env steps to the threshold are measured numbers
        assert re.fullmatch(r"\d+\.\d s", time_cell) and float(time_cell[:-2]) > 0, time_cell
        assert int(steps_cell.replace(",", "")) > 0
    else:
        assert time_cell == steps_cell == "-"
    assert cells[7] != "-" and float(cells[7]) > 50.0  # a final mean return well above random play (about 22)
    assert (out / "suite.png").stat().st_size > 5_000
    assert leaked_segments(before) == set()


def pbt_record(start: str, arm: str, seed: int, solved_s: float | None, best: float) -> dict:
    return {"task": "cartpole", "start": start, "arm": arm, "seed": seed, "budget_s": 180.0, "threshold": 475,
            "solved_s": solved_s, "env_steps": 1000, "final_best": best, "final_mean": best - 10}


def test_pbt_suite_table_counts_solved_runs_and_takes_medians():
    pbt_suite = module("pbt_suite")
    records = [pbt_record("lr_low", "pbt", 2, None, 300.0), pbt_record("lr_low", "pbt", 0, 90.0, 480.0),
               pbt_record("lr_low", "pbt", 1, 70.0, 490.0), pbt_record("lr_low", "single", 0, None, 20.0),
               pbt_record("lr_low", "single", 1, None, 30.0), pbt_record("lr_low", "single", 2, 150.0, 476.0),
               pbt_record("default", "single", 0, 12.0, 500.0)]
    rows = pbt_suite.table(records).splitlines()
    assert rows[0] == "| task | start | threshold | budget | single | population | pbt |"
    # the benchmark's order of starts, whatever the records' order; an arm with no runs is "-"
    assert rows[2] == "| cartpole | default | 475 | 180 s | 1 of 1, 12.0 s, best 500.0 | - | - |"
    # 2 of 3 solved: the median run is the slower solved one; 1 of 3: the median run did not solve
    assert rows[3] == ("| cartpole | lr_low | 475 | 180 s | 1 of 3, > 180 s, best 30.0 | - | "
                       "2 of 3, 90.0 s, best 480.0 |")
    assert len(rows) == 4


@pytest.mark.slow
def test_pbt_suite_resume_skips_recorded_runs_and_reports(tmp_path):
    pbt_suite = module("pbt_suite")
    plan = [("cartpole", "default", arm, seed) for arm in ("single", "pbt") for seed in (0, 1)]
    records = [pbt_record("default", "pbt", 0, 30.0, 480.0), pbt_record("lr_low", "single", 1, 40.0, 480.0)]
    assert pbt_suite.pending(plan, records) == [plan[0], plan[1], plan[3]]
    # every planned run recorded: --resume trains nothing and writes the report; without it, the file is refused
    (tmp_path / "pbt_suite.jsonl").write_text("".join(json.dumps(pbt_record("default", "single", seed, 20.0, 490.0))
                                                     + "\n" for seed in (0, 1)))
    command = [sys.executable, "scripts/pbt_suite.py", "--tasks", "cartpole", "--starts", "default", "--arms",
               "single", "--seeds", "2", "--out", str(tmp_path), "--train_dir", str(tmp_path / "runs")]
    resumed = subprocess.run([*command, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "0 of 2 runs to go" in resumed.stdout and not (tmp_path / "runs").exists()
    assert "| cartpole | default | 475 | 180 s | 2 of 2, 20.0 s, best 490.0 | - | - |" in \
        (tmp_path / "pbt_suite.md").read_text()
    assert (tmp_path / "pbt_suite.png").stat().st_size > 5_000
    refused = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--resume to go on" in refused.stderr


def test_pbt_suite_lowers_each_tasks_own_default_learning_rate():
    pbt_suite = module("pbt_suite")
    assert pbt_suite.start_flags("lr_low", "CartPole-v1") == [f"--learning_rate={Config.learning_rate / 100:g}"]
    image_rate = IMAGE_LEARNING["learning_rate"] / 100
    assert image_rate != Config.learning_rate / 100  # else this would not tell the two defaults apart
    assert pbt_suite.start_flags("lr_low", "catch") == [f"--learning_rate={image_rate:g}"]
    assert pbt_suite.start_flags("lambda_low", "catch") == ["--gae_lambda=0.5"]
    assert pbt_suite.start_flags("default", "catch") == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_interrupted_script_stops_its_trainer_as_ctrl_c_does_and_leaves_nothing(tmp_path):
    """SIGINT to a script that runs trainers (appo.tools.trainer_process.run_trainer), not to the trainer: the
    trainer was killed with its shared memory left and the script ended in a traceback."""
    before = shm_entries()
    log = tmp_path / "solve_0" / "log.txt"
    script = subprocess.Popen([sys.executable, "scripts/time_to_solve.py", "--runs", "2", "--target", "1000",
                               "--limit_s", "60", "--", "--env=CartPole-v1", "--num_workers=1",
                               "--num_envs_per_worker=2", f"--train_dir={tmp_path}"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: log.exists() and re.search(r"p0: v\d+", log.read_text()), 60, "the trainer's first status")
    script.send_signal(signal.SIGINT)
    out, err = script.communicate(timeout=60)
    assert script.returncode == 1 and err.strip().splitlines()[-1] == (
        "time_to_solve: interrupted (the trainer running was stopped as Ctrl-C stops it)"), err
    assert "Traceback" not in err and "Summary:" in log.read_text()  # the trainer stopped as on Ctrl-C
    assert not leaked_segments(before)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_time_to_solve_trains_each_run_afresh_in_a_train_dir_given_to_the_trainer(tmp_path):
    """Run again with the same --train_dir, its finished solve_0 said 'already finished' and the run counted as one
    that never solved."""
    command = [sys.executable, "scripts/time_to_solve.py", "--runs", "1", "--target", "30", "--limit_s", "60", "--",
               "--env=CartPole-v1", "--num_workers=1", "--num_envs_per_worker=2", f"--train_dir={tmp_path}"]
    for _ in range(2):
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=100)
        assert done.returncode == 0 and "run 0: " in done.stdout and "s to mean reward >= 30" in done.stdout, \
            done.stdout + done.stderr
