"""Physical devices: what this machine has. Nothing in gpulab hard-codes ``"cuda"``.

Code asks :func:`default_device` or :func:`physical_devices`, which fall back to the CPU, the way
d2l's ``try_gpu`` does. :func:`cuda_device_count` is the one GPU count in gpulab: it never
initialises CUDA, so ranks can still be forked after it was called.
"""

from __future__ import annotations

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
        return torch.cuda.device_count() if torch.cuda._is_compiled() else 0
    except Exception:  # noqa: BLE001 - a broken driver must not break discovery
        return 0


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
