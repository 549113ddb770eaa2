"""tools/gpu_check.py (``make gpu-check``): without a GPU it says so and exits 0; with one it runs the
GPU-marked tests, grades six labs and runs the benchmarks, stamping every result with the GPU, the
driver and torch (tested here with faked machine facts and stand-in steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import gpu_check  # noqa: E402

H100 = {"gpus": 2, "names": ["NVIDIA H100 80GB HBM3"] * 2, "driver": "570.86.15", "torch": "2.13.0+cu128", "cuda": "12.8"}


def test_without_a_gpu_it_says_so_and_exits_0() -> None:
    from gpulab.devices import cuda_device_count

    if cuda_device_count():
        pytest.skip("this machine has a GPU: gpu-check would run for real")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "no CUDA GPU that torch can use here" in proc.stdout and "doctor" in proc.stdout


def test_the_plan_covers_the_gpu_tests_six_labs_and_the_benchmarks(monkeypatch, capsys) -> None:
    monkeypatch.setattr(gpu_check, "machine", lambda: H100)
    assert gpu_check.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "*-nvidia-h100-80gb-hbm3-x2.json" in out and "gpu or multigpu" in out
    for lab in ("02_pipeline", "06_ddp", "07_model_parallel", "08_oom", "09_sharding", "10_search", "11_tensor_parallel"):
        assert f"lab:{lab}" in out
    assert "benchmarks/ddp.py" in out and "benchmarks/grading.py" not in out


def test_a_run_stamps_each_result_and_logs_every_step(tmp_path) -> None:
    bench = tmp_path / "toy.py"
    bench.write_text('import json\nprint("warming up")\nprint(json.dumps({"speedup": 2.5}))\n')
    steps = [("benchmark toy", [sys.executable, str(bench)]),
             ("a failing step", [sys.executable, "-c", "import sys; print('broken'); sys.exit(3)"])]
    assert gpu_check.run(tmp_path, steps, H100) == 1  # one step failed
    saved = json.loads((tmp_path / "toy-nvidia-h100-80gb-hbm3-x2.json").read_text())
    assert saved == {"device": H100, "result": {"speedup": 2.5}}
    log = (tmp_path / "gpu-check-nvidia-h100-80gb-hbm3-x2.log").read_text()
    assert "NVIDIA H100 80GB HBM3" in log and "driver 570.86.15" in log and "torch 2.13.0+cu128" in log
    assert "broken" in log and "FAIL a failing step" in log and "ok   benchmark toy" in log


def test_shuffle_runs_the_tests_in_another_order_drawn_from_its_seed() -> None:
    def order(*extra: str) -> list[str]:
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               "tests/devices/test_machine.py", *extra], cwd=REPO, capture_output=True, text=True, timeout=120)
        return [line for line in proc.stdout.splitlines() if "::" in line]

    plain, shuffled = order(), order("--shuffle", "7")
    assert sorted(plain) == sorted(shuffled) and plain != shuffled and shuffled == order("--shuffle", "7")


@pytest.mark.timeout(300)
def test_a_lab_step_passes_when_the_source_gets_its_auto_marks_and_the_release_zero() -> None:
    """The lab step grades as make grade does (here on the CPU): lab 04's written answer (2 points) is left to
    the instructor, so full auto marks are the maximum less those points, and the course copy goes."""
    import tempfile

    rc, text = gpu_check._grade("04_dataparallel")
    assert rc == 0, text
    assert "solution" in text and "student   0/" in text
    assert not list(Path(tempfile.gettempdir()).glob("gpu-check-04_dataparallel-*"))
