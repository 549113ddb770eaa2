"""UtilizationMonitor: CPU-only sampling, NVML missing or failing, a fake NVML, no leaked threads."""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import time
import types

import matplotlib
import numpy as np
import pytest

from gpulab.accel import SimAccelerator, spin
from gpulab.monitor import UtilizationMonitor
from gpulab.monitor import view as monitor_view

matplotlib.use("Agg")


def _wait_for_samples(mon: UtilizationMonitor, n: int, timeout: float = 10.0, work=None) -> None:
    """Run ``work()`` (or sleep) until the monitor has ``n`` samples; a loaded machine may be slow."""
    deadline = time.perf_counter() + timeout
    while len(mon.samples) < n and time.perf_counter() < deadline:
        work() if work else time.sleep(0.01)
    assert len(mon.samples) >= n, f"only {len(mon.samples)} samples in {timeout} s"


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpulab-monitor"]


def test_samples_cpu_cores_and_this_process_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    with UtilizationMonitor(interval=0.02) as mon:
        _wait_for_samples(mon, 6, work=lambda: spin(0.05))  # this thread keeps one core busy
    a = mon.arrays()
    n = len(a["t"])
    assert n >= 5 and np.all(np.diff(a["t"]) > 0)
    assert a["cpu"].shape[0] == n and a["cpu"].shape[1] >= 1
    assert np.all((a["cpu"] >= 0) & (a["cpu"] <= 100))
    # a spinning main thread uses up to one core; other load on a shared machine takes some of it
    assert np.median(a["process"]) > 20, "a spinning main thread should show clearly"
    assert a["gpu_util"].shape == (n, 0) and a["rss"].min() > 0
    assert "no GPU readings" in mon.status and "not installed" in mon.status
    assert "no GPU readings" in mon.summary()


def test_nvml_that_fails_to_load_is_reported_and_cpu_sampling_goes_on(monkeypatch) -> None:
    import pynvml

    def broken_init():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", broken_init)
    with UtilizationMonitor(interval=0.02) as mon:
        _wait_for_samples(mon, 3)
    assert "NVML could not start" in mon.status and "sampling CPU only" in mon.status
    assert len(mon.samples) >= 3 and mon.gpu_util.shape[1] == 0 and not mon.errors


def _fake_nvml(util: float = 97.0) -> types.SimpleNamespace:
    calls = {"shutdown": 0}

    def unsupported(h):
        raise RuntimeError("not supported")

    return types.SimpleNamespace(
        calls=calls,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=util if h == 0 else 5.0, memory=40.0),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3 * 2**30, total=16 * 2**30),
        nvmlDeviceGetTemperature=lambda h, kind: 77.0,
        nvmlDeviceGetPowerUsage=unsupported,  # a GPU that reports no power
    )


def test_gpu_readings_from_nvml_become_arrays(monkeypatch) -> None:
    fake = _fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with UtilizationMonitor(interval=0.02) as mon:
        _wait_for_samples(mon, 3)
    a = mon.arrays()
    assert a["gpu_util"].shape[1] == 2
    assert np.all(a["gpu_util"][:, 0] == 97.0) and np.all(a["gpu_util"][:, 1] == 5.0)
    assert np.all(a["gpu_mem_used"] == 3 * 2**30) and np.all(a["gpu_temp"] == 77.0)
    assert np.all(np.isnan(a["gpu_power"])), "an unsupported reading is NaN, not an error"
    assert "NVML: 2 GPU(s)" in mon.status and fake.calls["shutdown"] == 1
    text = monitor_view.format_sample(mon, mon.samples[-1])
    assert "gpu0" in text and "97.0%" in text and "77 C" in text


def test_simulated_accelerator_reads_like_gpu_util() -> None:
    acc = SimAccelerator()
    acc.compute(10.0)  # busy for the whole run
    with UtilizationMonitor(interval=0.03, accelerators=[acc], nvml=False) as mon:
        _wait_for_samples(mon, 3)
    util = mon.arrays()["sim_util"][:, 0]
    assert len(util) >= 3 and np.all(util > 95)
    assert "simulated" in mon.gpu_names[0]


def test_no_thread_is_left_running_after_an_exception() -> None:
    before = len(_monitor_threads())
    with pytest.raises(ZeroDivisionError):
        with UtilizationMonitor(interval=0.01) as mon:
            _wait_for_samples(mon, 1)
            1 / 0
    assert not mon.running and len(_monitor_threads()) == before
    assert len(mon.samples) >= 1  # what was measured before the error is kept


def test_a_sampler_that_keeps_failing_stops_its_thread(monkeypatch) -> None:
    mon = UtilizationMonitor(interval=0.005, nvml=False)
    monkeypatch.setattr(mon, "_take", lambda: (_ for _ in ()).throw(OSError("/proc unreadable")))
    mon.start()
    deadline = time.time() + 5
    while mon.running and time.time() < deadline:
        time.sleep(0.01)
    assert not mon.running and len(mon.errors) == 10 and "unreadable" in mon.errors[0]
    mon.stop()


def test_start_twice_and_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval"):
        UtilizationMonitor(interval=0)
    mon = UtilizationMonitor(interval=0.05, nvml=False).start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            mon.start()
    finally:
        mon.stop()
    mon.stop()  # twice is fine
    assert not mon.running


def _spin_child(seconds: float) -> None:
    spin(seconds)


def test_child_processes_count_toward_this_process() -> None:
    ctx = mp.get_context("fork")
    with UtilizationMonitor(interval=0.05, nvml=False) as mon:
        child = ctx.Process(target=_spin_child, args=(0.6,))
        child.start()
        time.sleep(0.1)
        mon._tree.rescan_soon()  # look for the child now rather than in 2 s
        child.join()
    # the main thread only sleeps; anything well above zero is the child's spinning
    assert mon.arrays()["process"].max() > 20


def test_live_view_headless_prints_the_summary_once(capsys) -> None:
    with UtilizationMonitor(interval=0.02, nvml=False) as mon:
        assert mon.live() is None
        _wait_for_samples(mon, 1)
    out = capsys.readouterr().out
    assert "needs a Jupyter kernel" in out and out.count("samples over") == 1


def test_live_view_in_a_kernel_updates_its_widget(monkeypatch) -> None:
    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(monitor_view, "_in_kernel", lambda: True)
    acc = SimAccelerator()
    with UtilizationMonitor(interval=0.02, accelerators=[acc], nvml=False) as mon:
        widget = mon.live(refresh=0.0)
        acc.compute(1.0)
        _wait_for_samples(mon, 2)
        assert "sim:0" in widget.value and "cpu cores" in widget.value
    assert widget.value.startswith("<pre>[stopped]")


def test_plot_has_device_and_cpu_panels() -> None:
    acc = SimAccelerator()
    with UtilizationMonitor(interval=0.02, accelerators=[acc], nvml=False) as mon:
        acc.compute(0.05)
        mon.mark("work")
        _wait_for_samples(mon, 3)
    fig = mon.plot()
    assert len(fig.axes) == 2 and fig.axes[0].lines and fig.axes[1].lines
