"""gpulab.monitor.nvml through the monitor: NVML missing or failing leaves CPU sampling on; a fake NVML's
readings become arrays (an unsupported reading is NaN)."""

from __future__ import annotations

import sys
import types

import numpy as np

from gpulab.monitor import UtilizationMonitor
from gpulab.monitor import view as monitor_view

from .sampling import wait_for_samples


def test_nvml_that_fails_to_load_is_reported_and_cpu_sampling_goes_on(monkeypatch) -> None:
    import pynvml

    def broken_init():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", broken_init)
    with UtilizationMonitor(interval=0.02) as mon:
        wait_for_samples(mon, 3)
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
        wait_for_samples(mon, 3)
    a = mon.arrays()
    assert a["gpu_util"].shape[1] == 2
    assert np.all(a["gpu_util"][:, 0] == 97.0) and np.all(a["gpu_util"][:, 1] == 5.0)
    assert np.all(a["gpu_mem_used"] == 3 * 2**30) and np.all(a["gpu_temp"] == 77.0)
    assert np.all(np.isnan(a["gpu_power"])), "an unsupported reading is NaN, not an error"
    assert "NVML: 2 GPU(s)" in mon.status and fake.calls["shutdown"] == 1
    text = monitor_view.format_sample(mon, mon.samples[-1])
    assert "gpu0" in text and "97.0%" in text and "77 C" in text
