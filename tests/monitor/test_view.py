"""gpulab.monitor.view: the live view headless and in a kernel, and the plot's panels."""

from __future__ import annotations

import matplotlib
import pytest

from gpulab.accel import SimAccelerator
from gpulab.monitor import UtilizationMonitor
from gpulab.monitor import view as monitor_view

from .sampling import wait_for_samples

matplotlib.use("Agg")


def test_live_view_headless_prints_the_summary_once(capsys) -> None:
    with UtilizationMonitor(interval=0.02, nvml=False) as mon:
        assert mon.live() is None
        wait_for_samples(mon, 1)
    out = capsys.readouterr().out
    assert "needs a Jupyter kernel" in out and out.count("samples over") == 1


def test_live_view_in_a_kernel_updates_its_widget(monkeypatch) -> None:
    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(monitor_view, "_in_kernel", lambda: True)
    acc = SimAccelerator()
    with UtilizationMonitor(interval=0.02, accelerators=[acc], nvml=False) as mon:
        widget = mon.live(refresh=0.0)
        acc.compute(1.0)
        wait_for_samples(mon, 2)
        assert "sim:0" in widget.value and "cpu cores" in widget.value
    assert widget.value.startswith("<pre>[stopped]")
    assert "samples over" not in widget.value, "the summary is printed by mon.summary(), not repeated in the widget"


def test_the_nvml_message_is_said_once(monkeypatch) -> None:
    # lab 01 prints mon.status, shows the live view, then prints the summary: one NVML message in all
    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(monitor_view, "_in_kernel", lambda: True)
    import pynvml

    def broken_init():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", broken_init)
    with UtilizationMonitor(interval=0.02, accelerators=[SimAccelerator()]) as mon:
        widget = mon.live(refresh=0.0)
        wait_for_samples(mon, 2)
    shown = "\n".join([mon.status, widget.value, mon.summary()])
    assert shown.count("NVML could not start") == 1, shown


def test_plot_has_device_and_cpu_panels() -> None:
    acc = SimAccelerator()
    with UtilizationMonitor(interval=0.02, accelerators=[acc], nvml=False) as mon:
        acc.compute(0.05)
        mon.mark("work")
        wait_for_samples(mon, 3)
    fig = mon.plot()
    assert len(fig.axes) == 2 and fig.axes[0].lines and fig.axes[1].lines
