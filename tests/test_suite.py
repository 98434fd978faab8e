"""The benchmark suite script on one short task: it trains, then writes its Markdown table and its PNG."""

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, shm_entries


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
    assert shm_entries() - before == set()
