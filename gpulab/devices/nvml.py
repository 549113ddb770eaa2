"""Starting NVML (nvidia-ml-py), the library ``nvidia-smi`` prints from: the one place gpulab opens it.

The doctor (:mod:`gpulab.devices.doctor`: driver version, the GPU list) and the utilisation monitor
(:mod:`gpulab.monitor.nvml`: readings every interval) both start NVML through :func:`open_nvml`, so
a missing package, a machine without an NVIDIA driver and a failing driver are told apart in one
place. It lives under ``devices`` because it is a fact about the machine; the monitor builds on it.

Example::

    opened = open_nvml()
    if opened.nvml is None:
        print(opened.error)          # why not, with the fix
    else:
        print(opened.nvml.nvmlDeviceGetCount())
        close_nvml(opened.nvml)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["NvmlOpen", "open_nvml", "close_nvml"]


@dataclass(frozen=True)
class NvmlOpen:
    """What :func:`open_nvml` found.

    Attributes:
        nvml: the ``pynvml`` module with NVML started (call :func:`close_nvml` when done), or None.
        missing: True when there is no NVML to start: nvidia-ml-py is not installed, or the NVIDIA
            driver's library is not on this machine (a CPU-only machine); False when NVML exists
            but failed to start (a driver problem worth reporting).
        error: why NVML did not start, naming the fix; None when it did.
    """

    nvml: Any = None
    missing: bool = False
    error: str | None = None


def open_nvml() -> NvmlOpen:
    """Import ``pynvml`` and start NVML (``nvmlInit``). Never raises: a failure is described instead."""
    try:
        import pynvml
    except Exception as err:  # noqa: BLE001 - ImportError, or a broken install: either way no NVML
        return NvmlOpen(missing=True, error=f"nvidia-ml-py is not installed ({err}); pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        missing = "LibraryNotFound" in type(err).__name__ or "not found" in str(err).lower()
        return NvmlOpen(missing=missing, error=f"NVML could not start ({type(err).__name__}: {err}); "
                                               "no NVIDIA driver on this machine?")
    return NvmlOpen(nvml=pynvml)


def close_nvml(nvml: Any) -> None:
    """Shut NVML down (``nvmlShutdown``); never raises, so it can sit in a ``finally``."""
    if nvml is None:
        return
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - shutting down must not raise
        pass
