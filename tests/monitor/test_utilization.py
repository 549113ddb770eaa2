"""gpulab.monitor.utilization: CPU-only sampling, simulated accelerators, no leaked threads, clear errors."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from gpulab.accel import SimAccelerator, spin
from gpulab.monitor import UtilizationMonitor

from .sampling import wait_for_samples


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpulab-monitor"]


def test_samples_cpu_cores_and_this_process_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    with UtilizationMonitor(interval=0.02) as mon:
        wait_for_samples(mon, 6, work=lambda: spin(0.05))  # this thread keeps one core busy
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


def test_simulated_accelerator_reads_like_gpu_util() -> None:
    acc = SimAccelerator()
    acc.compute(10.0)  # busy for the whole run
    with UtilizationMonitor(interval=0.03, accelerators=[acc], nvml=False) as mon:
        wait_for_samples(mon, 3)
    util = mon.arrays()["sim_util"][:, 0]
    assert len(util) >= 3 and np.all(util > 95)


def test_no_thread_is_left_running_after_an_exception() -> None:
    before = len(_monitor_threads())
    with pytest.raises(ZeroDivisionError):
        with UtilizationMonitor(interval=0.01) as mon:
            wait_for_samples(mon, 1)
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
