"""Lab 07 on a server with two GPUs, checked on a CPU.

tests/fake_cuda.py stands in for two CUDA GPUs: each tensor keeps the device it would live on, and
every op raises the device-mismatch error a GPU would raise. On it:

- the graders' references (gpulab's GPipe step and pipelined forward) get through the barriers
  and send GPipe's full timeline, as a student's thread-per-stage code does on GPUs;
- the graders run the student's code in IEEE float32 (no TF32), as the CPU reference computes;
- every code cell of the source notebook (the solutions, the demos, the graded cells and their
  hidden tests) runs, and no convolution or matrix product on a GPU runs with TF32 allowed, even
  in a graded cell that starts with cuDNN's default (TF32 on).

The timing cells run one round instead of five and the graded measured work runs once, unjudged:
timings on paper mean nothing, the devices are what is checked.
"""

from __future__ import annotations

import matplotlib
import nbformat
import pytest
import torch
from conftest import COURSE
from fake_cuda import FakeCuda
from torch import nn

import gpulab.grading
import gpulab.parallel.pipeline.timing
from gpulab.grading import lab07
from gpulab.grading.lab07 import (
    OVERLAPPED,
    reference_forward,
    run_with_timeout,
    stages_overlap,
    train_step_overlap,
    train_step_schedule,
)
from gpulab.parallel import split_model
from gpulab.parallel.pipeline import gpipe_train_step
from gpulab.profiling import interleave

NOTEBOOK = COURSE / "source" / "07_model_parallel" / "07_model_parallel.ipynb"
CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


@pytest.fixture
def gpus():
    with FakeCuda(num_gpus=2) as fake:
        yield fake


def _mse(out, target):
    return (out - target).square().mean()


def test_the_forward_reference_meets_the_barrier_on_gpus(gpus):
    devices = lab07.lab_devices(2)
    assert [d.physical for d in devices] == [CUDA0, CUDA1] and not devices.simulated
    x = torch.arange(4.0).unsqueeze(1)
    got = stages_overlap(reference_forward, devices, x, timeout_s=2.0)
    assert got["stages"] == OVERLAPPED
    assert got["output"].device == CUDA1 and torch.equal(got["output"].cpu(), x)


def test_the_gpipe_reference_meets_both_barriers_on_gpus(gpus):
    got = train_step_overlap(gpipe_train_step, lab07.lab_devices(2), torch.arange(4.0).unsqueeze(1), timeout_s=2.0)
    assert got == {"forward": OVERLAPPED, "backward": OVERLAPPED, "loss": 3.5, "gradients": [7.0, 7.0]}


def test_the_gpipe_reference_sends_both_passes_of_its_timeline_on_gpus(gpus):
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    split = split_model(model, lab07.lab_devices(2), boundaries=[2])
    facts = train_step_schedule(gpipe_train_step, split, torch.randn(10, 3), torch.randn(10, 2), 3, _mse)
    assert facts == {"events": 16, "missing": [], "unexpected": [], "out of order": "none"}


def test_graded_runs_compute_in_ieee_float32_and_put_the_settings_back():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = True  # cuDNN's default for convolutions; a student may set both
        assert run_with_timeout(lambda: (matmul.allow_tf32, cudnn.allow_tf32)) == (False, False)
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
        with pytest.raises(KeyError):  # put back when the student's code raises too
            run_with_timeout(lambda: {}["boom"])
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


# --- the whole notebook on two GPUs --------------------------------------------------------------

def _graded(cell) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get("grade")) and cell.cell_type == "code"


def _no_tf32_on_gpus(monkeypatch, found: list[str], where: list[str]) -> None:
    """Note every convolution and matrix product on a GPU that runs with TF32 allowed."""
    functional = torch.nn.functional
    for name, flag in (("conv2d", lambda: torch.backends.cudnn.allow_tf32),
                       ("linear", lambda: torch.backends.cuda.matmul.allow_tf32)):
        original = getattr(functional, name)

        def spy(input, *args, original=original, flag=flag, name=name, **kwargs):
            if input.is_cuda and flag():
                found.append(f"{where[0]}: {name} on {input.device} with TF32 allowed")
            return original(input, *args, **kwargs)

        monkeypatch.setattr(functional, name, spy)


def test_every_cell_of_the_lab_runs_on_two_gpus(monkeypatch):
    quick = interleave.time_interleaved

    def one_round(variants, repeats=5, warmup=1, **kwargs):
        return quick(variants, repeats=1, warmup=0, **{k: v for k, v in kwargs.items() if k != "progress"})

    def each_work_once(work, **kwargs):  # the measured work runs (on the GPUs' stages); its time is not judged here
        work(1)

    monkeypatch.setattr(gpulab.parallel.pipeline.timing, "time_interleaved", one_round)
    monkeypatch.setattr(gpulab.grading, "check_measured", each_work_once)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tf32: list[str] = []
    where = ["setup"]
    _no_tf32_on_gpus(monkeypatch, tf32, where)
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.allow_tf32, matmul.allow_tf32
    namespace: dict = {"__name__": "__main__"}
    try:
        with FakeCuda(num_gpus=2):
            for cell in nbformat.read(str(NOTEBOOK), as_version=4).cells:
                if cell.cell_type != "code":
                    continue
                where[0] = cell.metadata.get("nbgrader", {}).get("grade_id", cell.id)
                before = cudnn.allow_tf32, matmul.allow_tf32
                if _graded(cell):  # a graded cell must not rely on the setup cell: start from cuDNN's default
                    cudnn.allow_tf32 = matmul.allow_tf32 = True
                try:
                    exec(compile(cell.source, f"<{where[0]}>", "exec"), namespace)
                except Exception as err:
                    raise AssertionError(f"cell {where[0]} fails on two GPUs: {type(err).__name__}: {err}") from err
                finally:
                    if _graded(cell):
                        cudnn.allow_tf32, matmul.allow_tf32 = before
            assert namespace["devices"].physical == [CUDA0, CUDA1] and not namespace["devices"].simulated
            assert namespace["x"].device == CUDA0 and namespace["swept"]
            assert any(e.phase == "backward" for e in namespace["naive_pipe"].timeline), \
                "the naive split's GPU timeline lacks the backward pass"
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = saved
        plt.close("all")
    assert not tf32, "\n".join(dict.fromkeys(tf32))

