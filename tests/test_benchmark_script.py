"""scripts/benchmark.py, the tables at the standard budgets: one short Hopper cell interrupted after its first
trained checkpoint, resumed by the same command and finished (result file, Markdown row, curves), kept by a third
run that starts no trainer, and reported again from the results folder alone once its train dir is gone; the
report's rows (per run and kind of machine, pooled records, cells of defaults since changed) and a hard-cut
segment's end from recorded results; a cell whose run started at auto choices or defaults a new run no longer gets
is not resumed, and `--retire_defaults` sets it apart, finished or not."""

import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from appo.config import auto
from appo.config.cfg import parse_args, save_cfg
from appo.launch import new_experiment_defaults
from tests.conftest import REPO, leaked_segments, processes_mentioning, shm_entries, wait_for
from tests.test_reporting import module

CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pth$")
SCALE, BUDGET = 0.02, 20_000  # 1M env steps x 0.02: ten iterations of the trainer's Hopper defaults
HOPPER_AUTO = {"exploration_loss_coeff": "0.0", "actor_critic_share_weights": "False"}  # today's rules' choices


def learning(choices: dict[str, str]) -> dict[str, str]:
    """Auto choices but the sampler's sizing, which a start-up timing makes (on a busy machine Hopper's step is
    costly)."""
    return {name: value for name, value in choices.items() if name not in module("benchmark").THROUGHPUT_FLAGS}


def checkpoint_steps(exp_dir) -> list[int]:
    """Env steps of the cell's checkpoints (none before the trainer made its dir)."""
    folder = exp_dir / "checkpoint_p0"
    names = os.listdir(folder) if folder.is_dir() else []
    return sorted(int(match.group(1)) for match in map(CHECKPOINT.search, names) if match)


def wait_for_trained_checkpoint(exp_dir, process: subprocess.Popen, timeout: float) -> None:
    """Until a checkpoint with env steps in it is written (the first one, at version 0, has none)."""

    def trained() -> bool:
        assert process.poll() is None, process.communicate()[0][-3000:]
        return any(checkpoint_steps(exp_dir))

    wait_for(trained, timeout, "trained checkpoint", interval=0.05)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_cell_is_interrupted_resumed_finished_and_then_kept(tmp_path):
    before = shm_entries()
    train_dir, out, kept = tmp_path / "runs", tmp_path / "out", tmp_path / "results"
    command = [sys.executable, "scripts/benchmark.py", "mujoco-1m", "--tasks", "Hopper", "--seeds", "1",
               "--steps_scale", str(SCALE), "--extra_flags", "--save_every_sec=1", "--eval_episodes", "3",
               "--train_dir", str(train_dir), "--out", str(out), "--results", str(kept)]
    exp_dir = train_dir / "mujoco-1m" / f"Hopper+save_every_sec=1+x{SCALE:g}_0"  # the A/B flag and scale in the name
    result_path = exp_dir / "benchmark_result.json"
    try:
        # 1. SIGTERM once a trained checkpoint exists: the trainer is asked to stop, saves, the script says so
        first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for_trained_checkpoint(exp_dir, first, timeout=180)
        first.send_signal(signal.SIGTERM)
        output = first.communicate(timeout=90)[0]
        assert first.returncode == 130, output[-3000:]
        assert "run the same command again to resume" in output
        assert not result_path.exists() and not (exp_dir / "done").exists()
        stopped_at = checkpoint_steps(exp_dir)[-1]
        assert 0 < stopped_at < BUDGET

        # 2. the same command resumes from that checkpoint and finishes the cell
        second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
        assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
        result = json.loads(result_path.read_text())
        segments = result["segments"]
        assert [s["resumed_from_env_steps"] for s in segments] == [0, stopped_at]
        assert [learning(s["auto"]) for s in segments] == [HOPPER_AUTO] * 2  # the choices in force, each sitting
        assert result["wall_s"] == pytest.approx(sum(s["end"] - s["start"] for s in segments), abs=0.1)
        assert result["budget"] == BUDGET and result["env_steps"] >= BUDGET
        assert result["stop_reason"] == f"reached --train_for_env_steps={BUDGET}"
        assert result["final_episodes"] >= 1 and result["final_reward"] is not None
        assert result["eval"]["episodes"] == 3 and "--deterministic" in result["eval"]["command"]
        table = (out / "benchmarks.md").read_text()
        row = next(line for line in table.splitlines() if line.startswith("| Hopper |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == f"`--save_every_sec=1`, **quick look: {SCALE:g} of the budget** ({BUDGET:,} env steps)"
        assert cells[2].split(" (n=1)")[0] == module("benchmark").number(result["final_reward"])
        assert cells[3] == f"{module('benchmark').number(result['eval']['reward'])} (n=1)"
        assert cells[-2:] == ["2,383 ± 272", "2,410 ± 10"]  # CleanRL's and RL Zoo's Hopper
        assert "| Walker2d | not run yet |" in table and "## atari-10m: 10,000,000 env steps" in table
        assert (out / "benchmarks_mujoco-1m.png").stat().st_size > 5_000

        # 3. run again: the finished cell is kept, no trainer starts
        kept_mtime, log_size = result_path.stat().st_mtime_ns, (exp_dir / "log.txt").stat().st_size
        third = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert third.returncode == 0, (third.stdout + third.stderr)[-3000:]
        assert "finished before, kept" in third.stdout and "python -m appo.train" not in third.stdout
        assert result_path.stat().st_mtime_ns == kept_mtime and (exp_dir / "log.txt").stat().st_size == log_size

        # 4. the cell's numbers and curve are kept in the results folder: the report needs no train dir
        (kept_file,) = (kept / "mujoco-1m").iterdir()
        assert kept_file.name == f"{exp_dir.name}@{module('benchmark').machine_slug(result['machine'])}.json"
        kept_result = json.loads(kept_file.read_text())
        assert kept_result["final_reward"] == result["final_reward"]
        assert str(tmp_path) not in kept_file.read_text()  # the default train dir stands in for this machine's
        assert "--train_dir=train_dir/benchmark/mujoco-1m" in kept_result["flags"]
        assert "--train_dir=train_dir/benchmark/mujoco-1m " in kept_result["eval"]["command"]
        curve = kept_result["curve"]
        assert 1 <= len(curve["env_steps"]) == len(curve["reward"]) <= module("benchmark").CURVE_KEPT
        assert curve["env_steps"] == sorted(curve["env_steps"]) and curve["env_steps"][-1] <= result["env_steps"]
        shutil.rmtree(train_dir)
        fourth = subprocess.run([sys.executable, "scripts/benchmark.py", "--report", "--train_dir", str(train_dir),
                                 "--out", str(out), "--results", str(kept)], cwd=REPO, capture_output=True, text=True,
                                timeout=120)
        assert fourth.returncode == 0, (fourth.stdout + fourth.stderr)[-3000:]
        assert row in (out / "benchmarks.md").read_text().splitlines()
    finally:
        with contextlib.suppress(pytest.fail.Exception):  # what is left is killed, then the test fails
            wait_for(lambda: not processes_mentioning(str(train_dir)), 10, "end of the cells' processes")
        left = processes_mentioning(str(train_dir))
        for process in left:
            process.kill()
    assert left == []
    assert leaked_segments(before) == set()


def record(seed: int, reward: float, evaluation: float, episodes: int = 100, extra: tuple = (),
           machine: str = "AMD EPYC (AVX2), 2 CPUs") -> dict:
    return {"table": "mujoco-1m", "task": "Walker2d", "env": "Walker2d-v5", "seed": seed, "extra_flags": list(extra),
            "steps_scale": 1.0, "budget": 1_000_000, "env_steps": 1_001_472, "final_reward": reward,
            "final_episodes": episodes, "eval": {"episodes": 10, "reward": evaluation, "reward_std": 5.0},
            "wall_s": 300.0, "env_steps_per_s": 3338.2, "commits": ["abc1234"], "date": "2026-11-26",
            "machine": machine}


def test_rows_pool_seeds_per_run_and_mark_short_windows():
    benchmark = module("benchmark")
    found = [record(0, 1000.0, 1100.0), record(1, 2000.0, 2100.0), record(0, 3000.0, 3100.0, episodes=40,
                                                                             extra=("--gamma=0.99",))]
    lines = benchmark.rows("mujoco-1m", found)
    walker = [line for line in lines if line.startswith("| Walker2d |")]
    assert walker == [
        "| Walker2d | defaults | 1,500 ± 707 (n=2) | 1,600 ± 707 (n=2) | 5m00s | 3.34k | abc1234, 2026-11-26 | "
        "AMD EPYC (AVX2), 2 CPUs | 2,288 ± 572 | 3,479 ± 822 |",
        "| Walker2d | `--gamma=0.99` | 3,000 (n=1) † | 3,100 (n=1) | 5m00s | 3.34k | abc1234, 2026-11-26 | "
        "AMD EPYC (AVX2), 2 CPUs | 2,288 ± 572 | 3,479 ± 822 |"]
    assert "| Hopper | not run yet | - | - | - | - | - | - | 2,383 ± 272 | 2,410 ± 10 |" in lines
    assert "Walker2d seed 0: 40" in benchmark.section("mujoco-1m", found, None)
    arm = {**record(0, 1.0, 1.0, extra=("--gamma=0.99",)), "defaults_before": "abc1234"}  # an A/B arm set apart
    assert benchmark.run_label(arm) == "`--gamma=0.99`, defaults before abc1234"


def test_a_task_with_a_target_stops_there_and_its_row_says_so(tmp_path):
    benchmark = module("benchmark")
    pong = benchmark.Cell("atari-10m", "envpool:Pong-v5", 0, (), 1.0, str(tmp_path))
    breakout = benchmark.Cell("atari-10m", "envpool:Breakout-v5", 0, (), 1.0, str(tmp_path))
    assert "--target_reward=20" in pong.flags() and pong.name == "Pong_0"  # the same cell, resumable as it was
    assert not any(flag.startswith("--target_reward") for flag in breakout.flags())
    reached = {**record(0, 20.1, 20.8), "table": "atari-10m", "task": "Pong", "env": "envpool:Pong-v5",
               "budget": 10_000_000, "env_steps": 4_321_000,
               "stop_reason": "target reward 20 reached by p0 (mean 20.10 of 100) at 5000.0 s, 4321000 env steps"}
    (row,) = [line for line in benchmark.rows("atari-10m", [reached]) if line.startswith("| Pong |")]
    assert "| 20.10 (n=1) ‡ |" in row
    section = benchmark.section("atari-10m", [reached], None)
    assert "(`--target_reward`; Pong 20)" in section and "Pong seed 0: 4,321,000 env steps" in section
    at_budget = {**reached, "stop_reason": "reached --train_for_env_steps=10000000", "env_steps": 10_001_000}
    assert "‡" not in benchmark.section("atari-10m", [at_budget], None)


def test_rows_part_machines_and_show_pooled_records_as_they_were_kept():
    benchmark = module("benchmark")
    xeon = "Intel Xeon (AVX-512, bf16), 2 CPUs"
    pooled = {**record(0, 0.0, 0.0), "pooled": {"seeds": 3, "final_reward": [2737.0, 172.0],
                                                "eval_reward": [3628.0, 231.0], "eval_episodes": 10, "wall_s": 369,
                                                "env_steps_per_s": 2740.0}, "note": "pooled before"}
    del pooled["seed"], pooled["eval"]
    found = [record(0, 1000.0, 1100.0, machine=xeon), pooled, record(1, 2000.0, 2100.0, machine=xeon)]
    walker = [line for line in benchmark.rows("mujoco-1m", found) if line.startswith("| Walker2d |")]
    assert walker == [
        "| Walker2d | defaults | 2,737 ± 172 (n=3) | 3,628 ± 231 (n=3) | 6m09s | 2.74k | abc1234, 2026-11-26 | "
        "AMD EPYC (AVX2), 2 CPUs | 2,288 ± 572 | 3,479 ± 822 |",
        "| Walker2d | defaults | 1,500 ± 707 (n=2) | 1,600 ± 707 (n=2) | 5m00s | 3.34k | abc1234, 2026-11-26 | "
        f"{xeon} | 2,288 ± 572 | 3,479 ± 822 |"]
    section = benchmark.section("mujoco-1m", found, None)
    assert "finished cells: 5." in section and "- Walker2d on AMD EPYC (AVX2), 2 CPUs: pooled before." in section


def test_a_cell_kept_on_this_kind_of_machine_is_not_run_again(tmp_path, capsys):
    benchmark = module("benchmark")
    cell = benchmark.Cell("mujoco-1m", "Walker2d-v5", 0, (), 1.0, str(tmp_path / "runs"))
    path = benchmark.kept_path(str(tmp_path / "results"), "mujoco-1m", cell.name, benchmark.machine())
    os.makedirs(os.path.dirname(path))
    benchmark.write_json(path, record(0, 1000.0, 1100.0))
    assert benchmark.run_cell(cell, 10, str(tmp_path / "results")) == "kept"
    assert "finished before on this kind of machine" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()
    assert benchmark.machine_slug("Intel(R) Xeon(R) Processor (AVX-512, bf16), 2 CPUs") == \
        "intel-xeon-processor-avx-512-bf16-2-cpus"


def test_cells_of_changed_defaults_are_set_apart_and_the_new_defaults_run_under_the_same_names(tmp_path, capsys):
    benchmark = module("benchmark")
    results, runs = str(tmp_path / "results"), str(tmp_path / "runs")
    for seed, extra in ((0, ()), (1, ()), (0, ("--gamma=0.99",))):
        cell = benchmark.Cell("mujoco-1m", "Walker2d-v5", seed, extra, 1.0, runs)
        kept = {**record(seed, 1000.0 + seed, 1100.0, extra=extra), "experiment": cell.name}
        benchmark.keep(kept, cell.exp_dir, results)
        os.makedirs(cell.exp_dir)
        benchmark.write_json(os.path.join(cell.exp_dir, benchmark.RESULT), kept)
    hopper = {**record(0, 3000.0, 3100.0), "env": "Hopper-v5", "task": "Hopper", "experiment": "Hopper_0"}
    benchmark.keep(hopper, "no_dir", results)
    unfinished = benchmark.Cell("mujoco-1m", "Walker2d-v5", 2, (), 1.0, runs).exp_dir  # resumed, it would mix them
    os.makedirs(unfinished)
    benchmark.write_json(os.path.join(unfinished, benchmark.SEGMENTS), [{"start": 1.0, "end": 2.0}])

    assert benchmark.retire_defaults(runs, results, "mujoco-1m", ["Walker2d-v5"], "def5678") == (2, 3)
    assert sorted(os.listdir(os.path.join(results, "mujoco-1m"))) == [
        "Hopper_0@amd-epyc-avx2-2-cpus.json", "Walker2d+gamma=0.99_0@amd-epyc-avx2-2-cpus.json",
        "Walker2d_0@amd-epyc-avx2-2-cpus~defaults-before-def5678.json",
        "Walker2d_1@amd-epyc-avx2-2-cpus~defaults-before-def5678.json"]
    assert sorted(os.listdir(os.path.join(runs, "mujoco-1m"))) == [
        "Walker2d+gamma=0.99_0", "Walker2d_0~defaults-before-def5678", "Walker2d_1~defaults-before-def5678",
        "Walker2d_2~defaults-before-def5678"]
    assert os.listdir(f"{unfinished}~defaults-before-def5678") == [benchmark.SEGMENTS]  # set apart, not lost
    assert benchmark.retire_defaults(runs, results, "mujoco-1m", ["Walker2d-v5"], "9999999") == (0, 0)  # once only
    os.makedirs(os.path.join(runs, "mujoco-1m", "Hopper_0"))  # every task named, the first as well as the last
    assert benchmark.retire_defaults(runs, results, "mujoco-1m", ["Hopper-v5", "Walker2d-v5"], "abc1234") == (1, 1)
    assert os.path.isdir(os.path.join(runs, "mujoco-1m", "Hopper_0~defaults-before-abc1234"))

    # A new cell at the defaults is not taken for a kept one, and the old train dirs are not kept again as it.
    new = benchmark.Cell("mujoco-1m", "Walker2d-v5", 0, (), 1.0, runs)
    kept_path = benchmark.kept_path(results, "mujoco-1m", new.name, record(0, 0, 0)["machine"])
    assert not os.path.exists(kept_path)
    benchmark.keep_finished(runs, results)
    assert not os.path.exists(kept_path)
    benchmark.keep({**record(0, 2500.0, 2600.0), "experiment": new.name, "commits": ["def5678"]}, new.exp_dir, results)

    found = benchmark.results(results, "mujoco-1m")
    walker = [line for line in benchmark.rows("mujoco-1m", found) if line.startswith("| Walker2d |")]
    assert [line.split(" | ")[1:3] for line in walker] == [["defaults", "2,500 (n=1)"],
                                                            ["defaults before def5678", "1,000 ± 1 (n=2)"],
                                                            ["`--gamma=0.99`", "1,000 (n=1)"]]
    assert ("- *defaults before def5678*: Walker2d at the defaults of an earlier commit; at def5678 the defaults of "
            "these tasks changed") in benchmark.section("mujoco-1m", found, None)


def test_a_segment_cut_off_hard_ends_at_the_runs_last_log_write(tmp_path):
    benchmark = module("benchmark")
    (tmp_path / "log.txt").write_text("last status line\n")
    os.utime(tmp_path / "log.txt", (1_000_100.0, 1_000_100.0))
    segments = [{"start": 999_000.0, "end": 999_500.0}, {"start": 1_000_000.0, "end": None}]
    benchmark.close_cut_segment(segments, str(tmp_path))
    assert segments[1] == {"start": 1_000_000.0, "end": 1_000_100.0, "cut": True}
    assert segments[0] == {"start": 999_000.0, "end": 999_500.0}


def test_the_committed_page_is_what_the_kept_cells_give(tmp_path):
    """docs/benchmarks.md is written from docs/benchmark_results alone: regenerated here, it is the committed page
    (a number on the page is a kept cell's, or a pooled record's, never an edit)."""
    benchmark = module("benchmark")
    page = benchmark.write_report(str(tmp_path / "no_runs"), benchmark.RESULTS, str(tmp_path / "out"))
    with open(page) as mine, open(os.path.join(REPO, "docs", "benchmarks.md")) as committed:
        assert mine.read() == committed.read()


def test_the_kept_cells_name_no_folder_of_the_machine_that_ran_them():
    benchmark = module("benchmark")
    for path in glob.glob(os.path.join(benchmark.RESULTS, "*", "*.json")):
        with open(path) as f:
            text = f.read()
        assert json.loads(text) == benchmark.portable(json.loads(text)), path


def test_choices_differ_by_the_values_in_force_of_the_flags_a_rule_set_then_or_now():
    """Breakout's case: the run started where a rule chose bfloat16 from the CPU's flags; today's rules choose float32
    (no flag), and the same image values. The sampler's sizing, chosen by a timing, is no difference."""
    benchmark = module("benchmark")
    log = ["[21:40:01][MainProcess] auto: encoder nature_cnn for observation 'obs' (84x84 images)",
           "[21:40:01][MainProcess] auto: --ppo_epochs=1 --num_batches_per_iteration=1 --learning_rate=0.0005 "
           "--gamma=0.99 --exploration_loss_coeff=0.01 (image observations: ...)",
           "[21:40:01][MainProcess] auto: --learner_bf16=True --inference_bf16=True (image observations and a CPU "
           "with native bfloat16 that learns and infers: ...)",
           "[21:40:01][MainProcess] auto: --num_envs_per_worker=32 --actor_niceness=5 (1.20 ms per env step, ...)",
           "[21:40:02][MainProcess] auto: this CPU computes bfloat16 natively: --learner_bf16=True and "
           "--inference_bf16=True run the CNN in bfloat16 ...; float32 unless given"]  # a line naming flags it sets not
    then = benchmark.auto_flags(log)
    assert then == {"ppo_epochs": "1", "num_batches_per_iteration": "1", "learning_rate": "0.0005", "gamma": "0.99",
                    "exploration_loss_coeff": "0.01", "learner_bf16": "True", "inference_bf16": "True",
                    "num_envs_per_worker": "32", "actor_niceness": "5"}
    today, lines = parse_args(["--env=envpool:Breakout-v5"])[0], [line.split("] ", 1)[1] for line in log[:2]]
    today = dataclasses.replace(today, ppo_epochs=1, num_batches_per_iteration=1, learning_rate=0.0005, gamma=0.99,
                                exploration_loss_coeff=0.01)
    saved = dataclasses.replace(today, learner_bf16=True, inference_bf16=True, num_envs_per_worker=32, actor_niceness=5)
    now = benchmark.auto_flags(lines)
    assert benchmark.changed_choices(saved, then, today, now) == {"inference_bf16": (True, False),
                                                                   "learner_bf16": (True, False)}
    assert benchmark.changed_choices(today, then, today, now) == {}  # values, not rules: the same values mix nothing
    newer = dataclasses.replace(today, learning_rate=0.0003)  # a rule of today's that changed a value
    assert benchmark.changed_choices(today, then, newer, now) == {"learning_rate": (0.0005, 0.0003)}
    older = dataclasses.replace(today, adaptive_epochs=True, batch_size=64)  # plain defaults that changed since
    assert benchmark.changed_choices(older, {}, today, {}) == {"adaptive_epochs": (True, False),
                                                               "batch_size": (64, 256)}
    assert benchmark.changed_choices(dataclasses.replace(today, num_workers=7, seed=3), {}, today, {}) == {}


def test_a_cell_started_at_other_auto_choices_is_refused_whole_and_can_be_set_apart(tmp_path, capsys):
    """A HalfCheetah cell started under 26035ee's rule (std 0.5; today's is 1/sqrt(6)): no trainer starts, nothing of
    the cell changes, the one line says what to do; --retire_defaults sets the unfinished cell apart."""
    benchmark = module("benchmark")
    runs, results = str(tmp_path / "runs"), str(tmp_path / "results")
    cell = benchmark.Cell("mujoco-1m", "HalfCheetah-v5", 0, (), 1.0, runs)
    today, lines = new_experiment_defaults(cell.flags())
    assert today.initial_stddev == 0.408 and "auto: --initial_stddev=0.408 (" in "\n".join(lines)
    assert not os.path.exists(runs)  # worked out without touching the cell
    os.makedirs(cell.exp_dir)
    save_cfg(dataclasses.replace(today, initial_stddev=0.5), os.path.join(cell.exp_dir, "cfg.json"))
    with open(os.path.join(cell.exp_dir, "log.txt"), "w") as f:
        f.write("[04:40:00][MainProcess] auto: --exploration_loss_coeff=0.0 (continuous actions: ...)\n"
                "[04:40:00][MainProcess] auto: --initial_stddev=0.5 (continuous actions on vectors, ...)\n")
    segments = [{"start": 1.0, "end": 2.0, "commit": "26035ee", "auto": {"initial_stddev": "0.5"}}]
    benchmark.write_json(os.path.join(cell.exp_dir, benchmark.SEGMENTS), segments)
    before = {name: (tmp_path / "runs" / "mujoco-1m" / cell.name / name).read_bytes()
              for name in os.listdir(cell.exp_dir)}

    assert benchmark.run_cell(cell, 1, results) == "refused"
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"mujoco-1m HalfCheetah_0: not resumed: it started at defaults a new run no longer gets "
                    f"(--initial_stddev=0.5, today 0.408) and a resumed run keeps them; set it apart with `python "
                    f"scripts/benchmark.py mujoco-1m --tasks HalfCheetah --retire_defaults COMMIT` (COMMIT: the one "
                    f"that changed them), or move {cell.exp_dir} aside to start it over")
    assert {name: (tmp_path / "runs" / "mujoco-1m" / cell.name / name).read_bytes()
            for name in os.listdir(cell.exp_dir)} == before

    assert benchmark.retire_defaults(runs, results, "mujoco-1m", ["HalfCheetah-v5"], "66b3754") == (0, 1)
    assert sorted(os.listdir(f"{cell.exp_dir}~defaults-before-66b3754")) == sorted(before)
    assert not os.path.exists(cell.exp_dir)  # the new defaults' cell starts under the same name


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_short_cell_is_not_resumed_once_the_rules_choose_otherwise(tmp_path, monkeypatch, capsys):
    """A real first segment (a quick look at Hopper, a few seconds) records its trainer's choices; with today's
    rules as they were the cell may resume; once a rule chooses another value (monkeypatched) it is refused, with
    every file of the cell as it was."""
    benchmark = module("benchmark")
    cell = benchmark.Cell("mujoco-1m", "Hopper-v5", 0, (), 0.002, str(tmp_path / "runs"))
    assert benchmark.train(cell) == "done"
    (segment,) = benchmark.read_json(os.path.join(cell.exp_dir, benchmark.SEGMENTS), None)
    assert learning(segment["auto"]) == HOPPER_AUTO and segment["commit"] == benchmark.commit()
    os.remove(os.path.join(cell.exp_dir, "done"))  # as a cell stopped before its budget: the trainer would resume it
    assert benchmark.refusal(cell) is None

    monkeypatch.setattr(auto, "CONTINUOUS_LEARNING", {"exploration_loss_coeff": 0.001})
    files = {path: path.read_bytes() for path in (tmp_path / "runs").rglob("*") if path.is_file()}
    capsys.readouterr()
    assert benchmark.run_cell(cell, 1, str(tmp_path / "results")) == "refused"
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"mujoco-1m {cell.name}: not resumed: ") and "--retire_defaults" not in line  # a quick look
    assert "(--exploration_loss_coeff=0.0, today 0.001)" in line and line.endswith(f"move {cell.exp_dir} aside to "
                                                                                     "start it over")
    assert {path: path.read_bytes() for path in (tmp_path / "runs").rglob("*") if path.is_file()} == files
    assert processes_mentioning(str(tmp_path / "runs")) == []


def test_the_commit_is_dirty_for_changed_code_not_for_the_scripts_own_outputs(tmp_path, monkeypatch):
    benchmark = module("benchmark")
    monkeypatch.setattr(benchmark, "REPO", str(tmp_path))

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "docs" / "benchmark_results").mkdir(parents=True)
    for name in ("code.py", "docs/benchmarks.md", "docs/benchmarks_mujoco-1m.png", "docs/benchmark_results/a.json"):
        (tmp_path / name).write_text("old")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "c")
    clean = benchmark.commit()
    assert "+" not in clean and len(clean) >= 7
    for name in ("docs/benchmarks.md", "docs/benchmarks_mujoco-1m.png", "docs/benchmark_results/a.json"):
        (tmp_path / name).write_text("new")  # what a finished cell rewrites
    assert benchmark.commit() == clean
    (tmp_path / "code.py").write_text("new")
    assert benchmark.commit() == clean + "+dirty"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,expected", [
    (["--seeds", "0"], "--seeds=0 and --eval_episodes=10 must be 1 or more"),
    (["--eval_episodes", "0"], "--seeds=3 and --eval_episodes=0 must be 1 or more"),
    (["--extra_flags=--bogus=1"], "--extra_flags: unrecognized arguments: --bogus=1"),
    (["--extra_flags=--learning_rate=-1"], "--extra_flags: --learning_rate=-1.0: must be positive"),
])
def test_bad_arguments_are_one_line_before_any_cell_starts(tmp_path, args, expected):
    """Checked by the trainer's own parser before the first cell, not found by every cell failing."""
    out = subprocess.run([sys.executable, "scripts/benchmark.py", "mujoco-1m", "--tasks", "Hopper", *args,
                          f"--train_dir={tmp_path / 'runs'}", f"--out={tmp_path}", f"--results={tmp_path / 'kept'}"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(f"benchmark.py: error: {expected}")
    assert not (tmp_path / "runs").exists()
