"""`python -m appo.sweep`: a bad sweep file refused in one line before anything is made; a real study on CartPole with
a pruned and a failed trial, and its report; a sweep killed mid-trial, which leaves nothing running and continues
where it was; result.json of a run that reached its target."""

import dataclasses
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from appo.run.result import RunResult, read_result
from appo.run.stopping import TargetReached
from appo.sweep.cli import main
from appo.sweep.objectives import OBJECTIVES, TrialFailure
from appo.sweep.scheduler import Scheduler
from appo.sweep.space import load_sweep
from appo.sweep.trial import TrialRun
from tests.conftest import REPO, leaked_segments, processes_mentioning, shm_entries, wait_for

# A small CartPole trainer: one actor of 4 envs, summaries twice a second so the pruner sees each checkpoint.
CARTPOLE = {"train_for_env_steps": 20000, "num_workers": 1, "num_envs_per_worker": 4, "device": "cpu",
            "decorrelate_envs_on_one_worker": False, "stats_avg": 20, "experiment_summaries_interval": 0.5}
SPACE = {"learning_rate": {"low": 1e-6, "high": 1e-2, "log": True}, "batch_size": {"choices": [128, 100]}}


def write_sweep(folder, name: str = "sweep.yaml", **entries) -> str:
    sweep = {"env": "CartPole-v1", "flags": dict(CARTPOLE), "space": SPACE, **entries}
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        yaml.safe_dump(sweep, f, sort_keys=False)
    return path


def run_sweep(path: str, train_dir: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appo.sweep", path, f"--train_dir={train_dir}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def load(train_dir: str, study: str) -> optuna.Study:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{train_dir}/{study}/study.db")


def assert_nothing_left(train_dir: str, shm_before: set[str]) -> None:
    wait_for(lambda: not processes_mentioning(train_dir), 30, "end of every process of the sweep")
    assert leaked_segments(shm_before) == set()


@pytest.fixture
def shm_before():
    return shm_entries()


# ---------------------------------------------------------------- the sweep file, refused before anything is made
REFUSED = [
    ({"space": {"learning_rat": {"low": 1e-5, "high": 1e-2}}},
     "space.learning_rat: no trainer flag --learning_rat (did you mean --learning_rate?)"),
    ({"space": {"learning_rate": {"low": 0.0, "high": 1e-2}}}, "space.learning_rate.low: --learning_rate=0.0: must be"),
    ({"space": {"gae_lambda": {"low": 0.9, "high": 1.5}}}, "--gae_lambda=1.5: must be within [0, 1]"),
    ({"space": {"gae_lambda": {"choices": [0.9, -1.0]}}}, "space.gae_lambda.choices[1]: --gae_lambda=-1.0: must be"),
    ({"space": {"rollout": {"low": 8.0, "high": 64}}}, "space.rollout.low: --rollout=8.0: must be an integer"),
    ({"space": {"use_rnn": {"low": 0, "high": 1}}}, "--use_rnn takes True or False, not a range: give choices"),
    ({"space": {"experiment": {"choices": ["a", "b"]}}}, "--experiment is set by the sweep for each trial"),
    ({"sampler": "bayes"}, "sampler: 'bayes' must be one of tpe, random, cmaes, qmc"),
    ({"pruner": "hyperband"}, "pruner: 'hyperband' must be one of median, none"),
    ({"objective": "reward"}, "objective: 'reward' must be one of final_reward, best_reward"),
    ({"flags": {**CARTPOLE, "num_workers": 0}}, "flags.num_workers: --num_workers=0: must be a positive integer"),
    ({"enqueue": [{"learning_rate": 1.0}]}, "enqueue[0].learning_rate: 1.0 is outside the space's"),
    ({"objective": "env_steps_to_target"}, "--objective=env_steps_to_target needs a target: set target_reward"),
    ({"flags": {**CARTPOLE, "train_for_env_steps": 10_000_000_000}}, "--pruner=median compares trials at fixed env"),
    ({"env": "CartPol-v1"}, "--env=CartPol-v1: cannot be made"),
]


@pytest.mark.parametrize("entries, error", REFUSED, ids=[error.split(":")[0] for _, error in REFUSED])
def test_a_bad_sweep_file_is_refused_in_one_line_before_anything_is_made(tmp_path, capsys, entries, error):
    path = write_sweep(tmp_path, **entries)
    train_dir = tmp_path / "train_dir"
    assert main([path, f"--train_dir={train_dir}"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("appo.sweep: error: ") and stderr.count("\n") == 1, stderr
    assert error in stderr, stderr
    assert not train_dir.exists()


@pytest.mark.parametrize("args, error", [
    (["--sampler", "bayes"], "argument --sampler: invalid choice: 'bayes'"),
    (["--objective", "reward"], "argument --objective: invalid choice: 'reward'"),
    (["--", "--num_workers=0"], "--num_workers=0: must be a positive integer"),
    (["--", "--train_dir=elsewhere"], "--train_dir (after --) is set by the sweep for each trial"),
    (["--", "--learning_rate=0.1"], "--learning_rate (after --) is in the space"),
])
def test_bad_options_are_refused_in_one_line(tmp_path, capsys, args, error):
    path = write_sweep(tmp_path)
    assert main([path, f"--train_dir={tmp_path / 'train_dir'}", *args]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and error in stderr, stderr
    assert not (tmp_path / "train_dir").exists()


def test_a_python_sweep_file_and_yaml_numbers_without_a_dot(tmp_path):
    (tmp_path / "sweep.py").write_text('SWEEP = {"env": "CartPole-v1", "space": {"gamma": {"low": 0.9, "high": 1}},'
                                       ' "flags": {"train_for_env_steps": 1000}}\n')
    assert load_sweep(str(tmp_path / "sweep.py")).space[0].high == 1.0
    (tmp_path / "sweep.yaml").write_text("env: CartPole-v1\nspace:\n  learning_rate: {low: 1e-5, high: 1e-2}\n")
    assert load_sweep(str(tmp_path / "sweep.yaml")).space[0].low == 1e-5  # YAML reads 1e-5 as a string


def test_objectives_read_result_json():
    # Policy 1 ended 5 episodes at 120: no full --stats_avg window, so no score (the rule of the targets).
    result = RunResult.from_dict({"reason": "reached --train_for_env_steps=5000", "completed": True, "failed": False,
                                  "env_steps": 5000, "seconds": 10.0,
                                  "stats": {"0": {"reward": 80.0, "episodes": 20},
                                            "1": {"reward": 120.0, "episodes": 5}},
                                  "final_rewards": {"0": 80.0, "1": None}, "best_rewards": {"0": 95.0, "1": None},
                                  "target": None})
    assert OBJECTIVES["final_reward"].value(result) == (80.0, None)
    assert OBJECTIVES["best_reward"].value(result) == (95.0, None)
    assert OBJECTIVES["env_steps_to_target"].value(result) == (10000.0, False)  # not reached: twice what it used
    reached = dataclasses.replace(result, target=TargetReached("reward", 100.0, 1, 101.0, 3000, 4.5))
    assert OBJECTIVES["seconds_to_target"].value(reached) == (4.5, True)
    with pytest.raises(TrialFailure, match="no episode finished"):
        OBJECTIVES["final_reward"].value(dataclasses.replace(result, stats={}))
    short = dataclasses.replace(result, final_rewards={0: None, 1: None}, best_rewards={0: None, 1: None})
    for name in ("final_reward", "best_reward"):
        with pytest.raises(TrialFailure, match=r"no policy filled a full --stats_avg window \(20 and 5 episodes"):
            OBJECTIVES[name].value(short)


@pytest.mark.parametrize("pruner, bound", [(optuna.pruners.MedianPruner(), 3000.0), (optuna.pruners.NopPruner(), None)])
def test_a_to_target_study_prunes_by_cost_unless_its_pruner_is_none(tmp_path, pruner, bound):
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, direction="minimize", pruner=pruner)
    for value, reached in ((5000.0, True), (3000.0, True), (2000.0, False)):  # the unreached one is no bound
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={"reached": reached}))
    sweep = load_sweep(write_sweep(tmp_path, flags={**CARTPOLE, "target_reward": 40.0}))
    scheduler = Scheduler(study, storage, sweep, [], OBJECTIVES["env_steps_to_target"], str(tmp_path), 3, 1, [])
    assert scheduler.cost_bound() == bound


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_run_that_completed_before_the_sweeps_signal_reached_it_is_complete(tmp_path):
    # The pruner can decide at a run's last checkpoint while the trainer writes its last files: the SIGINT then ends
    # a run that has completed, and the exit code is the signal's, not a failure of the run.
    result = {"reason": "reached --train_for_env_steps=1000", "completed": True, "failed": False, "env_steps": 1024,
              "seconds": 1.0, "stats": {"0": {"reward": 50.0}}, "final_rewards": {"0": 50.0},
              "best_rewards": {"0": 50.0}, "target": None}
    exp_dir = tmp_path / "trial_0"
    # the handler is set as the trainer sets its own: a shell's background job (`cmd &`) starts with SIGINT ignored
    script = (f"import json, signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
              f"json.dump({result!r}, open({str(exp_dir / 'result.json')!r}, 'w')); "
              "print('written', flush=True); time.sleep(60)")
    run = TrialRun(optuna.create_study().ask(), [sys.executable, "-c", script], str(exp_dir),
                   OBJECTIVES["final_reward"], [])
    wait_for(lambda: "written" in (exp_dir / "output.txt").read_text(), 30, "the run's result.json")
    run.stop("pruned at 1000 env steps")
    assert run.process.wait(timeout=30) == -signal.SIGINT
    ended = run.finish()
    assert (ended.state, ended.value) == (TrialState.COMPLETE, 50.0), ended


def test_a_locked_database_is_refused_in_one_line(tmp_path, capsys):
    path = write_sweep(tmp_path)
    (tmp_path / "train_dir" / "sweep").mkdir(parents=True)
    holder = sqlite3.connect(tmp_path / "train_dir" / "sweep" / "study.db")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert main([path, f"--train_dir={tmp_path / 'train_dir'}"]) == 2
    finally:
        holder.close()
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "database is locked" in stderr, stderr


# ---------------------------------------------------------------- a real study
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_study_prunes_a_hopeless_trial_records_a_failed_one_and_reports(tmp_path, shm_before, capsys):
    # Two good learning rates finish; a far too small one falls below their median and is pruned; a batch size that
    # is no multiple of --rollout=32 is refused by the trainer (exit 2): FAIL, and the study goes on. 3 finished.
    path = write_sweep(tmp_path, name="cartpole.yaml", trials=3,
                       pruning={"checkpoints": 10, "startup_trials": 2, "warmup_checkpoints": 2},
                       enqueue=[{"learning_rate": 3e-3, "batch_size": 128}, {"learning_rate": 2e-3, "batch_size": 128},
                                {"learning_rate": 3e-3, "batch_size": 100}, {"learning_rate": 1e-6, "batch_size": 128}])
    train_dir = str(tmp_path / "train_dir")
    result = run_sweep(path, train_dir, "--seed=0", timeout=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_nothing_left(train_dir, shm_before)

    study = load(train_dir, "cartpole")
    states = {trial.number: trial.state for trial in study.trials}
    assert states == {0: TrialState.COMPLETE, 1: TrialState.COMPLETE, 2: TrialState.FAIL, 3: TrialState.PRUNED}, \
        result.stdout[-3000:]
    failed, pruned = study.trials[2], study.trials[3]
    assert "--batch_size=100 must be a multiple of --rollout=32 (exit code 2)" in failed.user_attrs["reason"]
    assert pruned.user_attrs["env_steps"] < CARTPOLE["train_for_env_steps"]
    # Reported on the sweep's checkpoints (each 2,000 env steps), pruned at its last one, before the finished trials'
    # last. A checkpoint a run passed before its first mean reward is skipped, so which early ones a trial has varies.
    grid = set(range(2000, CARTPOLE["train_for_env_steps"] + 1, 2000))
    finished = set(study.trials[0].intermediate_values)
    assert set(pruned.intermediate_values) <= grid and finished <= grid
    pruned_at = max(pruned.intermediate_values)
    assert pruned.user_attrs["reason"].startswith(f"pruned at {pruned_at} env steps: mean reward ")
    assert pruned_at < max(finished) and len(pruned.intermediate_values) < len(finished)
    for number in (0, 1):  # each trial a normal run: its own dir, its output, its result
        exp_dir = os.path.join(train_dir, "cartpole", f"trial_{number}")
        assert os.path.exists(os.path.join(exp_dir, "done"))
        assert "Stopped: reached --train_for_env_steps=20000" in pathlib.Path(exp_dir, "output.txt").read_text()
        final = read_result(exp_dir)
        assert study.trials[number].value == max(final.final_rewards.values())

    study_dir = os.path.join(train_dir, "cartpole")
    results = pathlib.Path(study_dir, "results.md").read_text()
    for line in ("| 2 | FAIL | 0.003 | 100 |", "| 3 | PRUNED | 1e-06 | 128 |", "| 0 | COMPLETE | 0.003 | 128 |"):
        assert line in results, results
    best = max(study.trials[:2], key=lambda trial: trial.value)
    command = pathlib.Path(study_dir, "best_command.txt").read_text().strip()
    assert command.startswith("python -m appo.train --env=CartPole-v1 --experiment=cartpole_best --train_for_env")
    assert f" --learning_rate={best.params['learning_rate']!r} --batch_size=128" in command
    assert command in result.stdout
    assert "2 complete, 1 pruned, 1 failed, 0 running; wall time 0:" in result.stdout
    for png in ("history.png", "importance.png"):
        assert os.path.getsize(os.path.join(study_dir, png)) > 0

    # The study remembers its sweep: another space or objective under its name is refused, the report alone is not.
    other = write_sweep(tmp_path, name="cartpole.yaml", space={"learning_rate": SPACE["learning_rate"]})
    assert main([other, f"--train_dir={train_dir}"]) == 2
    assert "was made by a sweep with other space" in capsys.readouterr().err
    assert main([path, f"--train_dir={train_dir}", "--objective", "best_reward"]) == 2
    assert "optimises --objective=final_reward (maximize), not best_reward" in capsys.readouterr().err
    path = write_sweep(tmp_path, name="cartpole.yaml")
    assert main([path, f"--train_dir={train_dir}", "--report"]) == 0
    assert "2 complete, 1 pruned, 1 failed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_killed_sweep_leaves_nothing_running_and_its_trial_is_run_again(tmp_path, shm_before):
    # The objective needs the target: the trial that is re-run reaches it, and its value is result.json's env steps.
    flags = {**CARTPOLE, "target_reward": 40.0, "train_for_env_steps": 100000}
    path = write_sweep(tmp_path, name="killed.yaml", trials=1, pruner="none", objective="env_steps_to_target",
                       flags=flags, enqueue=[{"learning_rate": 3e-3, "batch_size": 128}])
    train_dir = str(tmp_path / "train_dir")
    sweep = subprocess.Popen([sys.executable, "-m", "appo.sweep", path, f"--train_dir={train_dir}"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        summaries = os.path.join(train_dir, "killed", "trial_0", "summaries", "0")
        wait_for(lambda: os.path.isdir(summaries) and os.listdir(summaries), 60, "summaries of the first trial")
    finally:
        sweep.kill()
        sweep.wait(timeout=10)
    # The trainer got SIGTERM (PR_SET_PDEATHSIG), stopped its workers and freed its shared memory.
    assert_nothing_left(train_dir, shm_before)
    assert load(train_dir, "killed").trials[0].state is TrialState.RUNNING

    result = run_sweep(path, train_dir, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_nothing_left(train_dir, shm_before)
    trials = load(train_dir, "killed").trials
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.COMPLETE]  # 1 finished, as asked
    killed, rerun = trials
    assert "its sweep process" in killed.user_attrs["reason"]
    assert rerun.params == killed.params and rerun.user_attrs["rerun_of"] == 0
    reached = read_result(os.path.join(train_dir, "killed", "trial_1")).target
    assert rerun.value == reached.env_steps and rerun.user_attrs["reached"] is True


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_result_json_of_a_run_that_reached_its_target(trainer):
    result = trainer.run("--env=CartPole-v1", "--experiment=target", "--target_reward=40", "--stats_avg=20",
                         "--num_workers=1", "--num_envs_per_worker=4", "--device=cpu", "--learning_rate=0.003",
                         "--decorrelate_envs_on_one_worker=False", "--train_for_env_steps=200000")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved = read_result(os.path.join(trainer.train_dir, "target"))
    target = saved.target
    assert saved.completed and not saved.failed and saved.reason in result.stdout
    assert saved.reason.endswith(f" at {target.seconds:.1f} s, {target.env_steps} env steps")  # the stop line says it
    assert target.measure == "reward" and target.target == 40 and target.policy == 0
    assert target.mean >= 40 and 0 < target.env_steps <= saved.env_steps
    assert 0 < saved.seconds <= target.seconds + 30
    assert saved.stats[0]["episodes"] == 20 and saved.best_rewards[0] >= 40
    assert saved.checkpoint is not None and os.path.exists(saved.checkpoint)  # its newest, saved at the stop
