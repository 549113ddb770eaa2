"""Physical devices: what this machine has. Nothing in gpulab hard-codes ``"cuda"``.

Code asks :func:`default_device` or :func:`physical_devices`, which fall back to the CPU, the way
d2l's ``try_gpu`` does. :func:`cuda_device_count` is the one GPU count in gpulab: it never
initialises CUDA, so ranks can still be forked after it was called.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

__all__ = ["cuda_device_count", "physical_devices", "default_device"]


def cuda_device_count() -> int:
    """Number of CUDA GPUs torch can use here; 0 on a CPU build or when the driver fails.

    Fork-safe: ``torch.cuda.device_count()`` asks NVML first and does not initialise CUDA, whereas
    ``torch.cuda.is_available()`` may, and a process forked after CUDA initialised cannot use the
    GPU (torch's "Cannot re-initialize CUDA in forked subprocess").
    """
    try:
        # torch.cuda._is_compiled is private API: it is the cheap "is this a CUDA build" test that
        # torch.cuda.is_available itself uses, and it touches no driver.
        if not torch.cuda._is_compiled():
            return 0
        n = torch.cuda.device_count()
        if n == 0 or torch.cuda.is_initialized():  # CUDA already runs here: its own count is the truth
            return n
        return max(0, n - _unusable_by_nvml(os.environ.get("CUDA_VISIBLE_DEVICES"), torch.version.cuda))
    except Exception:  # a broken driver must not break discovery
        return 0


@functools.lru_cache(maxsize=8)
def _unusable_by_nvml(visible: str | None, build: str | None) -> int:
    """How many of the GPUs torch counts (through NVML, before CUDA starts) CUDA could not use.

    ``torch.cuda.device_count()`` is NVML's count: it says 1 where CUDA would say 0, and every lab
    then picks ``cuda`` and crashes. Two such cases are told from NVML alone (no CUDA context, so
    still fork-safe): a driver of an older CUDA major version than this build (all GPUs: minor-version
    compatibility does not cross a major version), and a whole GPU in MIG mode with no instance made
    (CUDA runs on MIG instances only). 0 where NVML cannot say.
    """
    from gpulab.devices.nvml import close_nvml, open_nvml, visible_gpus

    opened = open_nvml()
    nv = opened.nvml
    if nv is None:
        return 0
    try:
        gpus = visible_gpus(nv, visible)
        driver = int(nv.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 for CUDA 12.4
        if build and driver and driver // 1000 < int(build.split(".")[0]):
            return len(gpus)
        empty = 0
        for _, index in gpus:
            if index is None:  # a MIG instance named in CUDA_VISIBLE_DEVICES: usable
                continue
            h = nv.nvmlDeviceGetHandleByIndex(index)
            try:
                current, _pending = nv.nvmlDeviceGetMigMode(h)
            except Exception:  # not a MIG-capable GPU
                continue
            if current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1) and not _mig_instances(nv, h):
                empty += 1
        return empty
    except Exception:  # NVML could not say: trust torch's count
        return 0
    finally:
        close_nvml(nv)


def _mig_instances(nv: Any, h: Any) -> int:
    count = 0
    for j in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(h))):
        try:
            nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            count += 1
        except Exception:  # no instance in that slot
            continue
    return count


def physical_devices() -> list[torch.device]:
    """``[cuda:0, cuda:1, ...]`` when GPUs are usable, otherwise ``[cpu]``."""
    n = cuda_device_count()
    return [torch.device("cuda", i) for i in range(n)] if n else [torch.device("cpu")]


def default_device() -> torch.device:
    """The first GPU if there is one, else the CPU."""
    return physical_devices()[0]


def synchronize_all() -> None:
    """Wait for the work queued on every GPU this process uses, before a clock is read.

    CUDA kernels run asynchronously: a timer stopped when the Python call returns measures their
    launch, not their work. This waits for the current device and every device whose caching
    allocator holds memory (so it never creates a context on a GPU the process has not touched).
    Nothing happens on a CPU build or before CUDA is initialised: no work can be queued then.
    """
    # torch.cuda._is_compiled (private): the build test that touches no driver
    if not (torch.cuda._is_compiled() and torch.cuda.is_initialized()):
        return
    current = torch.cuda.current_device()
    for index in range(torch.cuda.device_count()):
        if index == current or torch.cuda.memory_reserved(index) > 0:
            torch.cuda.synchronize(index)
