"""gpulab.devices.meter_report: the report's table, numbers and plots, and format_bytes."""

from __future__ import annotations

import matplotlib
import pytest
import torch

from gpulab.devices import MemoryMeter, MemoryReport, format_bytes, logical_devices
from gpulab.parallel import comm

matplotlib.use("Agg")


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


def test_report_table_numbers_and_plots(devs) -> None:
    x = torch.randn(100, 10)
    meter = MemoryMeter(budget=2**20, devices=devs[:2])
    with meter:
        y = comm.to(x, devs[1])
        z = y * 2
    report = meter.report()
    assert isinstance(report, MemoryReport)
    text = str(report)
    assert "logical:1 -> cpu (simulated)" in text and "simulated" in text.splitlines()[0]
    assert format_bytes(2 * x.nbytes) in text and "imbalance" in text
    numbers = report.to_dict()
    assert numbers["devices"]["logical:1"] == {"live": 2 * x.nbytes, "peak": 2 * x.nbytes, "allocated": 2 * x.nbytes}
    assert numbers["imbalance"] == float("inf")  # device 0 held nothing
    assert repr(report) == text
    ax = report.plot()
    assert len(ax.patches) == 4  # peak and live bars for two devices
    ax = meter.plot_timeline()
    assert len(ax.lines) == 2  # device 1's line and the budget
    events = meter.timeline()
    assert [live for _, _, live in events] == [x.nbytes, 2 * x.nbytes]
    assert "peaks" in repr(meter)
    del y, z


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (512, 1536, 3 * 2**20, 5 * 2**30)] == [
        "512 bytes", "1.50 KiB", "3.00 MiB", "5.00 GiB"]
