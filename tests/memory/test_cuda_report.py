"""gpulab.memory.memory_report: the CUDA allocator's figures on a GPU, a meter's otherwise, and a
clear answer (not torch.cuda.memory_summary's KeyError) on a CPU with no meter."""

from __future__ import annotations

import pytest
import torch

from gpulab.devices import MemoryMeter
from gpulab.memory import memory_report
from gpulab.memory.cuda_report import CUDA_MODE, METER_MODE, NONE_MODE


def test_cpu_without_a_meter_says_what_to_do() -> None:
    status = memory_report(device="cpu")
    assert status.mode == NONE_MODE and status.allocated is None
    assert "MemoryMeter" in str(status) and "empty_cache" in str(status)


def test_cpu_reads_the_given_or_the_active_meter() -> None:
    with MemoryMeter() as meter:
        x = torch.empty(1000)
        active = memory_report(device="cpu")  # the innermost active meter, found by itself
        assert active.mode == METER_MODE and active.allocated == 4000 and active.reserved is None
        y = torch.empty(500)
        del y
    after = memory_report(meter, device="cpu")
    assert (after.allocated, after.peak) == (4000, 6000)
    assert "logical:0" in after.text  # the meter's table
    del x


def test_torch_cuda_summary_really_fails_on_a_cpu_only_machine() -> None:
    """The reason memory_report exists: the CUDA calls do not degrade on a CPU."""
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    assert torch.cuda.memory_stats() == {}
    with pytest.raises(KeyError):
        torch.cuda.memory_summary()


@pytest.mark.gpu
def test_cuda_allocator_figures() -> None:
    x = torch.empty(2**20, device="cuda")
    status = memory_report(device="cuda")
    assert status.mode == CUDA_MODE
    assert status.allocated == torch.cuda.memory_allocated() and status.reserved >= status.allocated
    del x
