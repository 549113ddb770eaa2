"""gpulab.devices.meter_ledger: live, peak and allocated bytes per device follow a written-out sequence of
allocations, frees and resizes exactly; the budget refuses what would not fit (with CUDA's wording);
a frozen ledger keeps its figures; the timeline records every change.

The ledger is driven directly with registry entries (no tensors): every figure is the hand sum.
"""

from __future__ import annotations

import pytest
import torch

from gpulab.devices import logical_devices
from gpulab.devices.meter_ledger import _Ledger as Ledger
from gpulab.devices.registry import Entry


@pytest.fixture
def devs():
    return logical_devices(2, physical=["cpu"])


def _entry(dev, nbytes: int) -> Entry:
    return Entry(dev, nbytes, ref=None, seq=0)


def test_live_peak_and_allocated_follow_a_written_out_sequence(devs) -> None:
    ledger = Ledger(budget=None, timeline=True)
    a, b, c = _entry(devs[0], 1000), _entry(devs[0], 500), _entry(devs[1], 300)
    for e in (a, b, c):
        ledger.count(e)
    assert (ledger.live(devs[0]), ledger.peak(devs[0]), ledger.live(devs[1])) == (1500, 1500, 300)
    ledger.release(a)
    ledger.count(_entry(devs[0], 200))
    assert (ledger.live(devs[0]), ledger.peak(devs[0])) == (700, 1500)
    Ledger.resize(b, 900)  # grew in place by 400: an out= op or resize_
    assert (ledger.live(devs[0]), ledger.peak(devs[0])) == (1100, 1500)
    rows = {r.device.index: r for r in ledger.rows()}
    assert (rows[0].live, rows[0].peak, rows[0].allocated) == (1100, 1500, 1000 + 500 + 200 + 400)
    assert (rows[1].live, rows[1].peak, rows[1].allocated) == (300, 300, 300)
    assert [d.index for d in ledger.devices()] == [0, 1]
    assert [live for _, _, live in ledger.timeline()] == [1000, 1500, 300, 500, 700, 1100]
    ledger.reset_peak()
    assert ledger.peak(devs[0]) == 1100
    assert ledger.live(logical_devices(3, physical=["cpu"])[2]) == 0  # never seen: nothing live


def test_the_budget_refuses_what_would_not_fit(devs) -> None:
    ledger = Ledger(budget=1024, timeline=False)
    ledger.count(_entry(devs[0], 1000))
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 100 bytes") as info:
        ledger.count(_entry(devs[0], 100))
    assert "1.00 KiB" in str(info.value) and "24 bytes is free" in str(info.value)
    ledger.count(_entry(devs[1], 1024))  # each device has its own budget
    grown = _entry(devs[1], 0)
    grown.nbytes, grown.ledgers = 1024, [ledger]
    with pytest.raises(torch.OutOfMemoryError):
        Ledger.resize(grown, 1025)
    assert ledger.live(devs[0]) == 1000 and ledger.live(devs[1]) == 1024  # a refused allocation counts nothing
    with pytest.raises(ValueError, match="smaller than the 1000 bytes already live on logical:0"):
        ledger.check_budget(512)
    ledger.check_budget(4096)


def test_a_frozen_ledger_keeps_its_figures(devs) -> None:
    ledger = Ledger(budget=None, timeline=False)
    a = _entry(devs[0], 64)
    ledger.count(a)
    ledger.frozen = True  # what a meter does when it exits
    ledger.release(a)
    Ledger.resize(a, 128)
    assert ledger.live(devs[0]) == 64 and ledger.peak(devs[0]) == 64
