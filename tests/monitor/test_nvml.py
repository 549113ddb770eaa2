"""gpulab.monitor.nvml through the monitor: NVML missing or failing leaves CPU sampling on; a fake NVML's
readings become arrays (an unsupported reading is NaN)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

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


@pytest.mark.gpu
def test_real_nvml_reads_the_gpus_torch_uses() -> None:
    """Each reading is of the GPU torch calls cuda:i (its name and memory size agree with CUDA's), and
    a kernel that keeps the GPU busy shows in GPU-Util."""
    import time

    import torch

    from gpulab.monitor.nvml import NvmlReader

    reader = NvmlReader()
    try:
        assert reader.ok, reader.describe()
        samples = reader.sample()
        assert [s.index for s in samples] == list(range(torch.cuda.device_count()))
        for s, name in zip(samples, reader.names):
            props = torch.cuda.get_device_properties(s.index)
            assert name == torch.cuda.get_device_name(s.index), (name, s.index)
            assert abs(s.mem_total - props.total_memory) <= 0.05 * props.total_memory
            assert s.temp is None or 0 < s.temp < 120
        torch.cuda._sleep(2_000_000_000)  # about a second of one spinning block on cuda:0 (private, see gpulab.accel.cuda)
        time.sleep(0.5)
        assert reader.sample()[0].util > 0, "NVML's GPU-Util sees the spinning kernel"
        torch.cuda.synchronize()
    finally:
        reader.close()
