"""gpulab.accel.sim: a DeviceValue waits for the simulated device only when it is read; a non-blocking copy
from unpinned memory still costs the host the copy time."""

from __future__ import annotations

import time

import pytest
import torch

from gpulab.accel import DeviceValue, SimAccelerator


def test_device_value_syncs_only_when_read() -> None:
    acc = SimAccelerator()
    total = 0
    t0 = time.perf_counter()
    for _ in range(3):
        total = total + acc.compute(0.02, torch.ones(4))
    assert isinstance(total, DeviceValue) and time.perf_counter() - t0 < 0.02  # nothing waited yet
    assert total.item() == pytest.approx(3.0)
    assert time.perf_counter() - t0 >= 0.06 - 1e-3 and acc.waited() > 0


def test_pinned_nonblocking_copies_overlap_only_when_pinned() -> None:
    # on a CPU build nothing can be pinned, so non_blocking still costs the host the copy time
    acc = SimAccelerator(h2d_gb_per_s=0.2)
    batch = torch.zeros(4_000_000, dtype=torch.uint8)  # 20 ms
    t0 = time.perf_counter()
    acc.copy(batch, non_blocking=True)
    assert time.perf_counter() - t0 >= 0.019
    assert not batch.is_pinned()
