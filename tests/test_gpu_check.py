"""scripts/gpu_check.py on a machine without CUDA: one line, exit 0, nothing written; and its checks with
--device=cpu, as one tries the script without a GPU (CI has none; the CUDA path itself ran on a lent H200,
docs/PERFORMANCE.md "On a GPU")."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow  # every test here starts a trainer or trains

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the whole check (minutes)")
@pytest.mark.timeout(120)
def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], lines
    assert not out.exists()


@pytest.mark.timeout(300)
def test_the_scaling_check_puts_each_worker_count_beside_the_raw_limit(tmp_path):
    """`--device=cpu --only scaling` (the script tried where there is no GPU): Breakout at 2 workers, its frames/s
    beside the raw limit its benchmark mode measured, in the report's table and in gpu_check.json."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_check.py"), "--device=cpu",
                           "--only=scaling", "--budget_scale=0.6", "--out", str(out)],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {row["check"]: row for row in json.loads((out / "gpu_check.json").read_text())["rows"]}
    bench = rows["scaling_w2"]["details"]["benchmark"]
    assert bench["num_workers"] == 2 and bench["env_frames_per_s"] > 0
    assert bench["raw_limit"]["env_frames_per_s"] > 0
    table = (out / "gpu_check.md").read_text().split("Breakout by actor workers")[1]
    assert f"| 2 | {bench['samples_per_s']:,.0f} | {bench['env_frames_per_s']:,.0f} | " \
           f"{bench['raw_limit']['env_frames_per_s']:,.0f} | {bench['fraction_of_raw_limit']:.0%} |" in table
