"""The benchmark suite script on one short task: it trains, then writes its Markdown table and its PNG."""

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
    assert cells[1:5] == ["CartPole-v1", "475", "15 s", cells[4]] and cells[4].endswith("of 1")
    assert cells[7] != "-" and float(cells[7]) > 50.0  # a final mean return well above random play (about 22)
    assert (out / "suite.png").stat().st_size > 5_000
    assert shm_entries() - before == set()
