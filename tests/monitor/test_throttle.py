"""gpulab.monitor.throttle through the monitor, with a fake NVML: the SM clock, the clocks-event
reasons and each GPU's limits are sampled; the reasons decode to NVML's names; the summary and plot
say what throttled; a GPU or driver without these readings, and a CPU-only machine, are told apart."""

from __future__ import annotations

import sys
import types

import matplotlib
import numpy as np
import pytest

from gpulab.monitor import UtilizationMonitor
from gpulab.monitor.throttle import THROTTLING, decode_reasons, format_thermals, plot_thermals, summarize_thermals

from .sampling import wait_for_samples

matplotlib.use("Agg")

POWER_CAP, SW_THERMAL, IDLE = 0x4, 0x20, 0x1


def _fake_nvml(*, event_api: bool = True, limits: bool = True) -> types.SimpleNamespace:
    """Two GPUs: gpu0 busy at 72 C / 650 W / 1410 MHz, held by the power cap and SW thermal
    slowdown; gpu1 idle at 35 C / 60 W / 345 MHz."""
    hot = {0: (72.0, 650_000, 1410, POWER_CAP | SW_THERMAL), 1: (35.0, 60_000, 345, IDLE)}
    nv = types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"Fake H100",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=99.0 if h == 0 else 0.0, memory=10.0),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2**30, total=80 * 2**30),
        nvmlDeviceGetTemperature=lambda h, kind: hot[h][0],
        nvmlDeviceGetPowerUsage=lambda h: hot[h][1],  # milliwatts
        nvmlDeviceGetClockInfo=lambda h, kind: hot[h][2] if kind == 1 else 9999,
    )
    reasons = lambda h: hot[h][3]
    if event_api:
        nv.nvmlDeviceGetCurrentClocksEventReasons = reasons
    else:  # a driver older than R535: only the old name
        nv.nvmlDeviceGetCurrentClocksThrottleReasons = reasons
    if limits:
        nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
        nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980 if kind == 1 else 9999
        nv.nvmlDeviceGetTemperatureThreshold = lambda h, kind: 87.0 if kind == 1 else 999.0
    return nv


@pytest.mark.parametrize("event_api", [True, False])
def test_clocks_reasons_and_limits_are_sampled(monkeypatch, event_api) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(event_api=event_api))
    with UtilizationMonitor(interval=0.02) as mon:
        wait_for_samples(mon, 3)
    a = mon.arrays()
    assert np.all(a["gpu_sm_clock"][:, 0] == 1410) and np.all(a["gpu_sm_clock"][:, 1] == 345)
    assert np.all(a["gpu_clock_reasons"][:, 0] == POWER_CAP | SW_THERMAL) and np.all(a["gpu_clock_reasons"][:, 1] == IDLE)
    assert [(lim.power_limit, lim.max_sm_clock, lim.slowdown_temp) for lim in mon.gpu_limits] == [(700.0, 1980.0, 87.0)] * 2
    hot, idle = summarize_thermals(mon)
    assert hot.reasons == {"sw_power_cap": pytest.approx(1.0), "sw_thermal_slowdown": pytest.approx(1.0), "_throttled": 1.0}
    assert idle.reasons == {"gpu_idle": pytest.approx(1.0), "_throttled": 0.0} and idle.throttled_share == 0.0
    assert (hot.temp_max, hot.power_max, hot.power_limit, hot.sm_clock_min, hot.max_sm_clock) == (72.0, 650.0, 700.0, 1410.0, 1980.0)
    text = format_thermals(mon)
    assert "sw_power_cap" in text and "THROTTLING" in text and "limit 700 W" in text and "slowdown at 87 C" in text
    assert "gpu_idle" in text and "not throttling" in text
    fig = plot_thermals(mon)
    assert len(fig.axes) == 3


def test_a_gpu_without_clock_readings_is_not_an_error(monkeypatch) -> None:
    nv = _fake_nvml(limits=False)
    del nv.nvmlDeviceGetCurrentClocksEventReasons
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    with UtilizationMonitor(interval=0.02) as mon:
        wait_for_samples(mon, 3)
    assert not mon.errors and np.all(np.isnan(mon.arrays()["gpu_clock_reasons"]))
    assert mon.gpu_limits[0].power_limit is None
    s = summarize_thermals(mon)[0]
    assert s.reasons == {} and s.power_limit is None and s.temp_max == 72.0
    assert "not supported here" in format_thermals(mon) and "limit -" in format_thermals(mon)


def test_a_cpu_only_machine_says_why_there_is_nothing_to_show() -> None:
    with UtilizationMonitor(interval=0.02, nvml=False) as mon:
        wait_for_samples(mon, 2)
    assert summarize_thermals(mon) == []
    assert "no GPU temperature" in format_thermals(mon) and "NVML not used" in format_thermals(mon)
    with pytest.raises(ValueError, match="no GPU readings"):
        plot_thermals(mon)


def test_decode_reasons_uses_nvml_names() -> None:
    assert decode_reasons(0) == [] and decode_reasons(None) == [] and decode_reasons(float("nan")) == []
    assert decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons(0x8 | 0x400) == ["hw_slowdown", "bit 0x400"]  # a reason newer than the table
    assert decode_reasons(float(0x80)) == ["hw_power_brake_slowdown"]
    assert THROTTLING & IDLE == 0 and THROTTLING & 0x2 == 0 and THROTTLING & POWER_CAP
