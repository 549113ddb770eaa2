"""gpulab.devices.meter_attribution: which logical device a new storage belongs to (the current device, the
inputs' device, device 0), counted against analytic byte counts."""

from __future__ import annotations

import pytest
import torch

from gpulab.devices import MemoryMeter, logical_devices, placement
from gpulab.parallel import comm

F32 = 4


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


def test_attribution_rules(devs) -> None:
    with MemoryMeter() as meter:
        with devs[2]:
            a = torch.empty(100)  # no inputs: the thread's current device
        b = comm.to(torch.ones(10), devs[1])
        with devs[2]:
            c = b * 2  # the inputs' device beats the current device
        d = torch.empty(7)  # neither: device 0
        pair = torch._foreach_mul([a, b], 2.0)  # list ops: each output goes with its own inputs
        assert [placement(t) for t in (a, c, d, *pair)] == [devs[2], devs[1], devs[0], devs[2], devs[1]]
        assert meter.live(devs[2]) == 2 * 100 * F32
