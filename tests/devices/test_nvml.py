"""gpulab.devices.nvml: the one NVML opener tells a missing package, a machine without a driver and
a failing driver apart (with fake pynvml modules), and its users report what it says."""

from __future__ import annotations

import sys
import types

from gpulab.devices import doctor
from gpulab.devices.nvml import close_nvml, open_nvml
from gpulab.monitor.nvml import NvmlReader


class NVMLError_LibraryNotFound(Exception):  # pynvml's own naming
    pass


class NVMLError_DriverNotLoaded(Exception):
    pass


def _fake(init_error: Exception | None = None) -> types.SimpleNamespace:
    calls = {"init": 0, "shutdown": 0}

    def init():
        calls["init"] += 1
        if init_error is not None:
            raise init_error

    return types.SimpleNamespace(calls=calls, nvmlInit=init, nvmlDeviceGetCount=lambda: 0,
                                 nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1))


def test_no_package_is_missing_and_names_the_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    opened = open_nvml()
    assert opened.nvml is None and opened.missing and "pip install nvidia-ml-py" in opened.error
    assert doctor.probe().nvml == "missing"
    assert "not installed" in NvmlReader().describe()


def test_no_driver_library_is_missing(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake(NVMLError_LibraryNotFound("NVML Shared Library Not Found")))
    opened = open_nvml()
    assert opened.nvml is None and opened.missing and "could not start" in opened.error


def test_a_failing_driver_is_an_error_not_missing(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake(NVMLError_DriverNotLoaded("Driver Not Loaded")))
    opened = open_nvml()
    assert opened.nvml is None and not opened.missing and "Driver Not Loaded" in opened.error
    assert doctor.probe().nvml.startswith("error: NVML could not start")


def test_a_started_nvml_is_returned_and_closed_once(monkeypatch) -> None:
    fake = _fake()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    opened = open_nvml()
    assert opened.nvml is fake and opened.error is None and fake.calls["init"] == 1
    close_nvml(opened.nvml)
    close_nvml(None)  # nothing to close: no error
    assert fake.calls["shutdown"] == 1


def test_close_never_raises() -> None:
    def broken():
        raise RuntimeError("uninitialised")

    close_nvml(types.SimpleNamespace(nvmlShutdown=broken))  # a finally: block must not raise


def _four_gpus() -> types.SimpleNamespace:
    """A started fake NVML with four GPUs, each busy at 10 x its NVML index percent."""
    uuids = ["GPU-aaaa1111", "GPU-bbbb2222", "GPU-cccc3333", "GPU-bbbb4444"]
    return types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=lambda h: uuids[h],
        nvmlDeviceGetName=lambda h: f"GPU{h}", NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=10.0 * h, memory=0.0),
        nvmlDeviceGetTemperatureV=lambda h, sensor: 40 + h)


def test_visible_gpus_number_them_as_cuda_does() -> None:
    from gpulab.devices.nvml import visible_gpus

    nv = _four_gpus()
    cases = {None: [(0, 0), (1, 1), (2, 2), (3, 3)], "2,0": [(0, 2), (1, 0)], "GPU-cccc": [(0, 2)],
             "1,7,2": [(0, 1)],            # CUDA stops at the first entry that names no GPU
             "GPU-bbbb": [],               # a prefix of two UUIDs names none
             "1,1": [],                    # a repeated GPU hides them all (torch's parser agrees)
             "": [], "MIG-9f00aa/1/0,3": [(0, None), (1, 3)]}
    for value, want in cases.items():
        assert visible_gpus(nv, value) == want, value


def test_the_monitor_reads_the_gpu_cuda_calls_cuda0(monkeypatch) -> None:
    """With CUDA_VISIBLE_DEVICES=2, cuda:0 is NVML's GPU 2: the monitor read GPU 0's figures instead."""
    monkeypatch.setitem(sys.modules, "pynvml", _four_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    reader = NvmlReader()
    (sample,) = reader.sample()
    assert (sample.index, sample.util, sample.temp) == (0, 20.0, 42.0)
    assert reader.describe() == "NVML: 1 GPU(s): cuda:0 = NVML GPU 2 GPU2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert NvmlReader().sample() == () and "no GPU visible to CUDA" in NvmlReader().describe()
