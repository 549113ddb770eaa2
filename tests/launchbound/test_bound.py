"""gpulab.launchbound.bound: the largest floor names the bound; ties and bad input."""

from __future__ import annotations

import pytest

from gpulab.launchbound.bound import Machine, StepCounts, classify_step, floors

CPU = Machine(overhead_s=3e-6, flops_per_s=2e11, bytes_per_s=2e10)


def test_each_bound() -> None:
    assert classify_step(StepCounts(ops=40, flops=40 * 1024, bytes=40 * 8 * 1024), CPU) == "overhead"
    assert classify_step(StepCounts(ops=4, flops=4e6, bytes=4e7), CPU) == "memory"  # 2 ms of bytes
    assert classify_step(StepCounts(ops=1, flops=2 * 1024**3, bytes=12 * 2**20), CPU) == "compute"


def test_floors_are_seconds_and_a_tie_goes_to_overhead() -> None:
    step = StepCounts(ops=1, flops=3e-6 * 2e11, bytes=3e-6 * 2e10)
    assert floors(step, CPU) == pytest.approx({"overhead": 3e-6, "memory": 3e-6, "compute": 3e-6})
    assert classify_step(step, CPU) == "overhead"


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        classify_step(StepCounts(-1, 0, 0), CPU)
    with pytest.raises(ValueError, match="positive"):
        classify_step(StepCounts(1, 1, 1), Machine(0, 1, 1))
