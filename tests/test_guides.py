"""The guides in docs/guide_*.md, run as a reader would: every ```bash and ```python block, in order.

Each guide runs in its own temporary folder (so train_dir/, videos and exports land there, not in the
repository), with the repository on PYTHONPATH as it is on sys.path when the commands run from its root
(`examples.custom_env:make_reach_target` must import) and paths like `examples/...` and `scripts/...` made
absolute. A bash block is one command per line (a trailing backslash continues it; `#` lines are
comments); a python block is written to a file and run with this interpreter (a fragment that is not meant
to run goes in a ```text block). Later blocks use what earlier ones trained, as the reader's would. Each
guide then has its own check that the output means something.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

from tests.conftest import REPO, leaked_segments, shm_entries, wait_for

GUIDES = sorted(os.path.basename(path) for path in glob.glob(os.path.join(REPO, "docs", "guide_*.md")))
FENCE = re.compile(r"^```(bash|python)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
REPO_PATHS = re.compile(r"(?<![\w./-])(examples|scripts|tests)/")
COMMAND_TIMEOUT = 90


def blocks(guide: str) -> list[tuple[str, str]]:
    """The guide's (language, text) blocks in order."""
    with open(os.path.join(REPO, "docs", guide)) as f:
        return FENCE.findall(f.read())


def bash_commands(text: str) -> list[str]:
    """One command per line; a trailing backslash joins the next line, `#` lines are comments."""
    commands, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.strip() if current else line.rstrip()
        if current.endswith("\\"):
            current = current[:-1].rstrip() + " "
            continue
        commands.append(current.strip())
        current = ""
    assert not current, f"a command ends in a backslash: {current}"
    return commands


def localized(command: str) -> str:
    """The command as run from the repository root: repo paths absolute, `python` this interpreter."""
    command = REPO_PATHS.sub(lambda m: f"{REPO}/{m.group(1)}/", command)
    return re.sub(r"^python3?(?= )", sys.executable, command)


def session_processes(sid: int) -> list[int]:
    found = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid:
                found.append(pid)
        except OSError:
            pass
    return found


def run(args: list[str], cwd: str, timeout: float = COMMAND_TIMEOUT) -> str:
    """Run in a session of its own; on a timeout every process of that session is killed. Returns stdout and
    stderr together, after checking the exit code and that no process of the session is left."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
           "PYTHONDONTWRITEBYTECODE": "1"}  # nothing written into the repository, not even __pycache__
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{args} ran past {timeout} s:\n{output[-3000:]}")
    wait_for(lambda: not session_processes(proc.pid), 5, f"end of the processes {args} started")
    assert proc.returncode == 0, f"{args} exited with {proc.returncode}:\n{output[-3000:]}"
    return output


def run_guide(guide: str, cwd: str) -> list[tuple[str, str]]:
    """Every block of the guide, in order: (what ran, its output)."""
    results = []
    for number, (language, text) in enumerate(blocks(guide)):
        if language == "python":
            script = os.path.join(cwd, f"block_{number}.py")
            with open(script, "w") as f:
                f.write(text)
            results.append((f"python block {number}", run([sys.executable, script], cwd)))
        else:
            for command in bash_commands(text):
                results.append((command, run(["bash", "-c", localized(command)], cwd)))
    return results


def output_of(results: list[tuple[str, str]], start: str, nth: int = 0) -> str:
    """The output of the nth command (or python block) that starts with `start`."""
    matching = [output for what, output in results if what.startswith(start)]
    assert len(matching) > nth, f"no {start!r} (#{nth}) among {[what for what, _ in results]}"
    return matching[nth]


def mean_return(output: str) -> float:
    """The mean return of `appo.enjoy`'s summary line: 'N episodes: return MEAN ± STD, length ...'."""
    found = re.findall(r"\d+ episodes: return (-?[0-9.]+) ±", output)
    assert found, output[-2000:]
    return float(found[-1])


# ---------------------------------------------------------------- what each guide must show
def check_custom_env(results, cwd):
    assert "env ok" in output_of(results, "python block")
    trained = mean_return(output_of(results, "python -m appo.enjoy --experiment=reach "))
    random_play = float(re.search(r"random play: return (-?[0-9.]+)", output_of(results, "python -c")).group(1))
    assert trained > random_play + 1.0, (trained, random_play)  # about 1.65 against -0.42
    assert "Stopped: reached --train_for_env_steps=30000" in output_of(results, "python examples/custom_env.py --env")
    played = output_of(results, "python examples/custom_env.py enjoy")
    assert "3 episodes: return" in played
    video = re.search(r"video: (\S+\.mp4) \((\d+) frames of 256x32\)", played)
    assert video and int(video.group(2)) > 0 and os.path.getsize(os.path.join(cwd, video.group(1))) > 0, played


def check_custom_metrics(results, cwd):
    exp_dir = os.path.join(cwd, "train_dir", "reach_metrics")
    stopped = output_of(results, "python -m appo.train --env=examples.custom_env:make_reach_target "
                                 "--experiment=reach_goal")
    assert "Stopped: target objective 0.95 reached by p0" in stopped, stopped[-3000:]
    with open(os.path.join(exp_dir, "checkpoint_p0", "best.json")) as f:
        best = json.load(f)
    assert best["metric"] == "reached" and best["value"] >= 0.9, best
    assert os.path.getsize(os.path.join(cwd, "reached.png")) > 0
    assert "plot: reached.png" in output_of(results, "python -m appo.plot")
    assert f"return {best['results']['reward']:.2f}" in output_of(results, "python -m appo.enjoy")
    hooked = output_of(results, "python block")
    stats = re.search(r"final stats: (.*)", hooked).group(1)
    for name in ("reward", "reached", "final_distance", "unshaped_return"):
        assert f"'{name}'" in stats, stats
    assert re.search(r"hooks saw \d+ episodes", hooked), hooked[-2000:]


def check_python_api(results, cwd):
    output = output_of(results, "python block")
    assert re.search(r"mean return ([0-9.]+) over \d+ episodes", output), output[-3000:]
    assert float(re.search(r"mean return ([0-9.]+)", output).group(1)) > 100  # random play: about 22
    assert "ConfigError: --num_workers" in output
    counts = output_of(results, "python examples/launcher_with_hooks.py").strip().splitlines()[-1]
    assert counts.startswith("hook counts: ") and '"evaluations"' in counts, counts


def check_enjoy_export(results, cwd):
    exp_dir = os.path.join(cwd, "train_dir", "cartpole")
    assert mean_return(output_of(results, "python -m appo.enjoy")) > 100  # random play: about 22
    video = output_of(results, "python -m appo.enjoy", 1)
    assert re.search(r"video: \S+/policy0_v\d+\.mp4 \(\d+ frames of 600x400\)", video), video
    assert os.path.getsize(os.path.join(exp_dir, "export", "policy0.onnx")) > 0
    assert "inputs obs; outputs action_params, values" in output_of(results, "python -m appo.export --experiment")
    assert os.path.getsize(os.path.join(cwd, "cartpole.pt")) > 0
    assert os.path.getsize(os.path.join(cwd, "curves.png")) > 0
    onnx_play = output_of(results, "python block", 0)
    assert "['obs'] ['action_params', 'values']" in onnx_play
    assert float(re.search(r"onnx policy: return ([0-9.]+)", onnx_play).group(1)) > 50  # one episode
    assert "torchscript agrees" in output_of(results, "python block", 1)


def check_sweeps(results, cwd):
    study_dir = os.path.join(cwd, "train_dir", "cartpole")
    first = output_of(results, "python -m appo.sweep examples/sweeps/cartpole.yaml")
    assert "New study cartpole" in first and "Study cartpole: " in first, first[-3000:]
    best = output_of(results, "cat train_dir/cartpole/best_command.txt").strip()
    assert best.startswith("python -m appo.train --env=CartPole-v1 --experiment=cartpole_best ") and best in first
    continued = output_of(results, "python -m appo.sweep examples/sweeps/cartpole.yaml --trials 5")
    assert "Continuing study cartpole" in continued and "4 of 5 trials finished" in continued, continued[-3000:]
    finished = re.search(r"Study cartpole: (\d+) complete, (\d+) pruned", output_of(results, "python -m appo.sweep",
                                                                                    2))
    assert int(finished.group(1)) + int(finished.group(2)) == 5
    for name in ("results.md", "history.png", "study.db"):
        assert os.path.getsize(os.path.join(study_dir, name)) > 0


def check_tracking(results, cwd):
    first = output_of(results, "python -m appo.train --env=CartPole-v1 --experiment=tracked")
    resumed = output_of(results, "python -m appo.train --env=CartPole-v1 --experiment=tracked", 1)
    assert "Stopped: reached --train_for_env_steps=40000" in resumed, resumed[-3000:]
    assert "tracking stops" not in first + resumed, (first + resumed)[-3000:]
    summary = output_of(results, "python -m wandb leet inspect")
    assert re.search(r"^state\s+finished", summary, re.M) and re.search(r"^\s+episode/reward\s", summary, re.M), summary
    read_back = output_of(results, "python block")
    steps = int(re.search(r"mlflow: run tracked FINISHED, episode/reward at \d+ points up to (\d+) env steps",
                          read_back).group(1))
    assert steps >= 40000 and re.search(r"jsonl: \d+ lines, episode/reward", read_back), read_back
    assert re.search(r"mlflow artifacts: \['videos/policy0_v\d+\.mp4'\]", read_back), read_back
    assert os.path.getsize(os.path.join(cwd, "train_dir", "tracked", "learning_curve.png")) > 0


def check_turn_based(results, cwd):
    trained = output_of(results, "python -m appo.train --env=pettingzoo.classic.connect_four_v3:env")
    assert "ratings: p0 Elo" in trained and "Stopped: reached --train_for_env_steps=40000" in trained, trained[-3000:]
    exp_dir = os.path.join(cwd, "train_dir", "connect_four")
    with open(os.path.join(exp_dir, "result.json")) as f:
        assert json.load(f)["faults"]["illegal_actions"] == 0
    scored = [output_of(results, "python -m appo.versus", n) for n in range(2)]
    records = [re.search(r"win rate ([0-9.]+), illegal (\d+)", output) for output in scored]
    assert all(record and record.group(2) == "0" for record in records), records
    assert float(records[0].group(1)) >= 0.8  # against random play; an untrained policy wins about half
    assert "inputs action_mask, observation;" in output_of(results, "python -m appo.export --experiment=connect_four")
    wins = int(re.search(r"onnx policy: (\d+) wins of 20", output_of(results, "python block")).group(1))
    assert wins >= 14, wins


CHECKS = {"guide_custom_env.md": check_custom_env, "guide_custom_metrics.md": check_custom_metrics,
          "guide_python_api.md": check_python_api, "guide_enjoy_export.md": check_enjoy_export,
          "guide_sweeps.md": check_sweeps, "guide_tracking.md": check_tracking,
          "guide_turn_based.md": check_turn_based}


def test_every_guide_is_checked_and_linked_from_the_readme():
    assert sorted(CHECKS) == GUIDES
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    for guide in GUIDES:
        assert f"(docs/{guide})" in readme, guide
        assert blocks(guide), f"{guide} has no command to run"


@pytest.mark.slow
def test_commands_are_parsed_as_a_reader_would():
    assert bash_commands("# note\npython -m a \\\n    --b=1\n\npython c.py\n") == ["python -m a --b=1", "python c.py"]
    assert localized("python examples/x.py --out=train_dir/scripts/y") == \
        f"{sys.executable} {REPO}/examples/x.py --out=train_dir/scripts/y"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("guide", sorted(CHECKS))
def test_guide_commands_run(guide, tmp_path):
    before = shm_entries()
    results = run_guide(guide, str(tmp_path))
    CHECKS[guide](results, str(tmp_path))
    assert leaked_segments(before) == set()
