"""Lab 06's notebooks/source/06_ddp/train_ddp.py runs under torchrun with 2 CPU processes (once).

torchrun starts 3 interpreters (its agent and 2 ranks), each importing torch: about 12 s on a
2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "notebooks" / "source" / "06_ddp" / "train_ddp.py"


@pytest.mark.timeout(240)
def test_train_ddp_under_torchrun(tmp_path):
    out = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
           "--epochs", "2", "--samples", "1024", "--workers", "2", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"
    first, last = summary["history"]
    assert last["loss"] < first["loss"], "two epochs of SGD should lower the training loss"
    assert first["val_samples"] == 1024 // 8, "evaluation must see every validation sample exactly once"
    assert json.loads(proc.stdout.strip().splitlines()[0])["epoch"] == 0, "only rank 0 prints, one JSON line per epoch"
    assert len(proc.stdout.strip().splitlines()) == 2


def test_the_docstring_gives_single_and_multi_node_commands():
    doc = SCRIPT.read_text().split('"""')[1]
    assert "torchrun --standalone --nproc_per_node=2 train_ddp.py" in doc
    assert "--nnodes=2" in doc and "--rdzv-endpoint=" in doc
