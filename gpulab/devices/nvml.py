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

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["NvmlOpen", "open_nvml", "close_nvml", "visible_gpus"]


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
    except Exception as err:  # ImportError, or a broken install: either way no NVML
        return NvmlOpen(missing=True, error=f"nvidia-ml-py is not installed ({err}); pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
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
    except Exception:  # shutting down must not raise
        pass


def _uuid(nvml: Any, index: int) -> str:
    try:
        u = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
        return u.decode() if isinstance(u, bytes) else str(u)
    except Exception:  # a GPU without a readable UUID matches no UUID entry
        return ""


def visible_gpus(nvml: Any, visible: str | None = None) -> list[tuple[int, int | None]]:
    """The GPUs a CUDA process sees, in CUDA's numbering: ``[(cuda index, NVML index), ...]``.

    NVML numbers every GPU of the machine; CUDA numbers only those ``CUDA_VISIBLE_DEVICES`` lists,
    in its order, so with ``"2,0"`` ``cuda:0`` is NVML's GPU 2 (JupyterHub, SLURM and shared servers
    set it). Entries are indices or UUIDs (``GPU-8f2e...``; a unique prefix is enough). As in CUDA
    (and torch's own parser), the list ends at the first entry that names no GPU, and a repeated
    GPU hides them all. A MIG instance (``MIG-...``) has no whole-GPU reading: its NVML index is
    None. Unset, every GPU is visible in NVML's order (CUDA's too with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, which servers usually set).

    Args:
        nvml: a started ``pynvml`` (:func:`open_nvml`).
        visible: the variable's value; default: this process's environment.
    """
    count = int(nvml.nvmlDeviceGetCount())
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [(i, i) for i in range(count)]
    found: list[int | None] = []
    uuids: list[str] | None = None
    for entry in visible.split(","):
        entry = entry.strip()
        if entry.startswith("MIG-"):
            found.append(None)
            continue
        if entry.lstrip("+-").isdigit():
            index: int | None = int(entry) if 0 <= int(entry) < count else None
        elif entry.startswith("GPU-"):
            uuids = uuids if uuids is not None else [_uuid(nvml, i) for i in range(count)]
            matches = [i for i, u in enumerate(uuids) if u.startswith(entry)]
            index = matches[0] if len(matches) == 1 else None
        else:
            index = None
        if index is None:
            break  # CUDA stops at the first entry that names no GPU
        if index in found:
            return []
        found.append(index)
    return list(enumerate(found))
