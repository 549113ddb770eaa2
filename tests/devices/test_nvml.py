"""gpulab.devices.nvml: the one NVML opener tells a missing package, a machine without a driver and
a failing driver apart (with fake pynvml modules), and its users report what it says."""

from __future__ import annotations

import sys
import types

from gpulab.devices import doctor
from gpulab.devices.nvml import close_nvml, open_nvml
from gpulab.monitor.nvml import NvmlReader


class NVMLError_LibraryNotFound(Exception):  # noqa: N801 - pynvml's own naming
    pass


class NVMLError_DriverNotLoaded(Exception):  # noqa: N801
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
