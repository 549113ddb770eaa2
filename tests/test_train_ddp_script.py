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
    from gpulab.devices.physical import cuda_device_count

    assert summary["world_size"] == 2 and summary["backend"] == ("nccl" if cuda_device_count() >= 2 else "gloo")
    first, last = summary["history"]
    assert last["loss"] < first["loss"], "two epochs of SGD should lower the training loss"
    assert first["val_samples"] == 1024 // 8, "evaluation must see every validation sample exactly once"
    assert json.loads(proc.stdout.strip().splitlines()[0])["epoch"] == 0, "only rank 0 prints, one JSON line per epoch"
    assert len(proc.stdout.strip().splitlines()) == 2


def test_the_docstring_gives_single_and_multi_node_commands():
    doc = SCRIPT.read_text().split('"""')[1]
    assert "torchrun --standalone --nproc_per_node=2 train_ddp.py" in doc
    assert "--nnodes=2" in doc and "--rdzv-endpoint=" in doc


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_ddp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_every_rank_of_a_node_chooses_the_same_backend(gpus, ranks):
    """1 GPU and 2 ranks used to give rank 0 nccl and rank 1 gloo: a job that hangs until its timeout."""
    chosen = [_script().choose_device(r, ranks, gpus) for r in range(ranks)]
    assert len({backend for backend, _ in chosen}) == 1
    backend = chosen[0][0]
    assert backend == ("nccl" if gpus >= ranks else "gloo")
    devices = [str(d) for _, d in chosen]
    assert devices == ([f"cuda:{r}" for r in range(ranks)] if backend == "nccl" else ["cpu"] * ranks)
