"""scripts/gpu_check.py on a machine without CUDA: one line, exit 0, nothing written (CI has no GPU; the CUDA path
itself ran on a lent H200, docs/PERFORMANCE.md "On a GPU")."""

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
