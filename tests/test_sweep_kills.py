"""A sweep process SIGKILLed at any moment (between asking for a trial and claiming it, after the claim, while telling
how a trial ended, at random) and run again finishes with exactly --trials finished trials, none left RUNNING; the
claims of trials that no sweep runs any more (a killed one's, a partial one, another host's that lapsed) are failed.

The sweep runs with a stand-in trainer (a few lines that write result.json), so that a run takes a second or two;
APPO_SWEEP_KILLS=20 makes the random case kill it 20 times in a row (about 2 minutes; 3 by default)."""

import os
import random
import socket
import subprocess
import sys
import time

import optuna
import psutil
import pytest
import yaml
from optuna.trial import TrialState

from appo.sweep import study as sweep_study
from tests.conftest import REPO, processes_mentioning, wait_for
from tests.test_sweep import load

TRIALS = 4
KILLS = int(os.environ.get("APPO_SWEEP_KILLS", "3"))
# The sweep under test, with a stand-in trainer, a short wait for unclaimed trials and frequent renewals; the first
# argument says where it kills itself: "<point>:<trial>" (point: before_claim, after_claim, in_tell) or "none".
DRIVER = """
import json, os, signal, sys
import optuna
from appo.sweep import cli, scheduler, study, trial

study.UNCLAIMED_S, scheduler.RENEW_S = 3.0, 0.3
TRAINER = ("import json, sys, time; time.sleep(0.3); json.dump({'reason': 'done', 'completed': True, 'failed': False, "
           "'env_steps': 100, 'seconds': 0.3, 'stats': {'0': {'reward': 1.0, 'episodes': 10}}, "
           "'final_rewards': {'0': 1.0}, 'best_rewards': {'0': 1.0}, 'target': None}, "
           "open(sys.argv[1] + '/result.json', 'w'))")
point, _, at = sys.argv[1].partition(":")
claimed = set()

def die(here):
    if point == here and len(claimed) == int(at):
        os.kill(os.getpid(), signal.SIGKILL)

class StandIn(trial.TrialRun):
    def __init__(self, run_trial, command, exp_dir, *args):
        super().__init__(run_trial, [sys.executable, "-c", TRAINER, exp_dir], exp_dir, *args)

def claim(run_trial):
    first = run_trial.number not in claimed
    if first:
        claimed.add(run_trial.number)
        die("before_claim")
    study.claim(run_trial)
    if first:
        die("after_claim")

real_tell = optuna.Study.tell
def tell(self, *args, **kwargs):
    die("in_tell")  # the trial's user attrs are written, its state not
    return real_tell(self, *args, **kwargs)

scheduler.TrialRun, scheduler.claim, optuna.Study.tell = StandIn, claim, tell
sys.exit(cli.main(sys.argv[2:]))
"""


def sweep_command(tmp_path, kill: str, trials: int) -> list[str]:
    path = tmp_path / "kills.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump({"env": "CartPole-v1", "pruner": "none",
                                        "flags": {"train_for_env_steps": 1000, "num_workers": 1},
                                        "space": {"learning_rate": {"low": 1e-5, "high": 1e-2, "log": True}}}))
    return [sys.executable, "-c", DRIVER, kill, str(path), f"--train_dir={tmp_path / 'train_dir'}", "--seed=0",
            f"--trials={trials}"]


def run_driver(tmp_path, kill: str = "none", trials: int = TRIALS) -> subprocess.CompletedProcess:
    return subprocess.run(sweep_command(tmp_path, kill, trials), cwd=REPO, capture_output=True, text=True,
                          timeout=90)


def assert_finished_with_exactly_the_trials(tmp_path, trials: int = TRIALS) -> None:
    result = run_driver(tmp_path, trials=trials)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    made = load(str(tmp_path / "train_dir"), "kills").trials
    states = [trial.state for trial in made]
    assert states.count(TrialState.COMPLETE) == trials and TrialState.RUNNING not in states, (states, result.stderr)
    assert all(trial.state is TrialState.COMPLETE or "re-enqueued" in trial.user_attrs.get("reason", "")
               for trial in made), [trial.user_attrs.get("reason") for trial in made]
    wait_for(lambda: not processes_mentioning(str(tmp_path)), 10, "end of every process of the sweep")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_sweep_killed_at_each_step_of_a_trial_finishes_with_exactly_its_trials(tmp_path):
    # Each kill is followed at once by the next run, well within UNCLAIMED_S of the trial it left unclaimed.
    for kill in ("before_claim:2", "after_claim:1", "in_tell:1", "before_claim:1"):
        result = run_driver(tmp_path, kill)
        assert result.returncode == -9, f"{kill}: {result.returncode} {result.stderr[-3000:]}"
    assert_finished_with_exactly_the_trials(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(60 + 10 * KILLS)
def test_a_sweep_killed_at_random_moments_in_a_row_finishes_with_exactly_its_trials(tmp_path):
    # About a trial a run between the kills: twice as many trials as kills leaves the last run some to do.
    rng, trials = random.Random(0), 2 * KILLS
    for _ in range(KILLS):
        sweep = subprocess.Popen(sweep_command(tmp_path, "none", trials), cwd=REPO, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            sweep.wait(timeout=rng.uniform(1.5, 5.0))  # from the imports (about 2 s here) to the trials' ends
        except subprocess.TimeoutExpired:
            sweep.kill()
        sweep.wait(timeout=10)
    assert_finished_with_exactly_the_trials(tmp_path, trials)


def running_trial(study: optuna.Study, **attrs) -> int:
    trial = study.ask()
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    return trial.number


def test_trials_that_no_sweep_runs_any_more_are_failed_whatever_their_claim(tmp_path, monkeypatch):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/study.db")
    study = optuna.create_study(storage=storage, study_name="claims")
    here, now = socket.gethostname(), time.time()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=30)
    me = {"host": here, "pid": os.getpid(), "pid_started": psutil.Process().create_time(), "renewed": now}
    kept = [running_trial(study, claim=me),  # this process
            running_trial(study, claim={"host": "elsewhere", "pid": 1, "pid_started": 0.0, "renewed": now - 60})]
    young = [running_trial(study),  # just asked for: its sweep claims it in a moment
             running_trial(study, host=here),  # a sweep of old killed between the three writes of its claim
             running_trial(study, claim={"host": here})]  # part of a claim: as none
    failed = [running_trial(study, host=here, pid=int(gone.stdout), pid_started=0.0),  # a whole claim of old
              running_trial(study, claim={"host": "elsewhere", "pid": 1, "pid_started": 0.0, "renewed": now - 3600})]
    assert sorted(sweep_study.fail_abandoned(study, storage)) == failed
    monkeypatch.setattr(sweep_study, "UNCLAIMED_S", 0.0)  # the unclaimed ones grow old
    assert sorted(sweep_study.fail_abandoned(study, storage)) == young
    trials = study.get_trials()
    assert [trial.number for trial in trials if trial.state is TrialState.RUNNING] == kept
    assert "renewed its claim 60 min ago" in trials[failed[1]].user_attrs["reason"]
    assert "ended before it claimed it" in trials[young[1]].user_attrs["reason"]
