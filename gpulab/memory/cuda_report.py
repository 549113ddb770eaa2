"""memory_report(): one call for "how much memory is in use?", whatever the machine.

On a GPU the answer is the CUDA caching allocator's: ``allocated`` (bytes in live tensors),
``reserved`` (what the allocator holds from the driver: allocated plus cached free blocks, what
``nvidia-smi`` shows for the process, minus the CUDA context) and their peaks, plus
``torch.cuda.memory_summary()``'s full table. On a CPU-only machine the CPU allocator keeps no
statistics: ``torch.cuda.memory_stats()`` is empty and ``torch.cuda.memory_summary()`` raises
``KeyError``, so the answer is a :class:`~gpulab.devices.MemoryMeter`'s (the one given, or the
innermost active one).

    print(memory_report())                  # on a GPU: the allocator; on a CPU: the active meter
    with MemoryMeter() as meter:
        ...
    print(memory_report(meter))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpulab.devices import cuda_device_count, default_device
from gpulab.devices import meter_threads as threads
from gpulab.devices.meter import MemoryMeter
from gpulab.devices.meter_report import format_bytes

__all__ = ["memory_report", "MemoryStatus", "CUDA_MODE", "METER_MODE", "NONE_MODE"]

CUDA_MODE = "CUDA allocator"
METER_MODE = "MemoryMeter"
NONE_MODE = "nothing to read"


@dataclass
class MemoryStatus:
    """What :func:`memory_report` returns; print it for the text."""

    mode: str  # CUDA_MODE, METER_MODE or NONE_MODE
    device: str
    allocated: int | None  # bytes in live tensors (None: unknown)
    peak: int | None
    reserved: int | None  # CUDA only: held by the caching allocator
    text: str

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def _cuda_status(device: torch.device, meter: MemoryMeter | None, abbreviated: bool) -> MemoryStatus | None:
    try:
        if cuda_device_count() == 0:
            return None
        stats = torch.cuda.memory_stats(device)
    except Exception:  # a broken driver: fall back to the meter
        return None
    if not stats:  # CUDA works but nothing was ever allocated: memory_summary() would raise KeyError
        text = f"{CUDA_MODE} on {device}: nothing allocated yet"
        status = MemoryStatus(CUDA_MODE, str(device), 0, 0, 0, text)
    else:
        allocated = int(stats.get("allocated_bytes.all.current", 0))
        peak = int(stats.get("allocated_bytes.all.peak", 0))
        reserved = int(stats.get("reserved_bytes.all.current", 0))
        head = (f"{CUDA_MODE} on {device}: {format_bytes(allocated)} allocated (peak {format_bytes(peak)}), "
                f"{format_bytes(reserved)} reserved ({format_bytes(reserved - allocated)} cached, free for "
                "reuse; torch.cuda.empty_cache() gives it back to the driver)")
        try:
            table = torch.cuda.memory_summary(device, abbreviated=abbreviated)
        except KeyError:
            table = ""
        status = MemoryStatus(CUDA_MODE, str(device), allocated, peak, reserved, head + ("\n" + table if table else ""))
    if meter is not None:
        status.text += "\n" + meter.report().table()
    return status


def memory_report(meter: MemoryMeter | None = None, device: torch.device | str | None = None, *,
                  abbreviated: bool = True) -> MemoryStatus:
    """The memory in use: the CUDA allocator's statistics on a GPU, a MemoryMeter's otherwise.

    Args:
        meter: a meter (active or finished) to report; default: the innermost active one. On a
            GPU its table is added below the allocator's.
        device: the device to report (default: the first GPU, else the CPU).
        abbreviated: passed to ``torch.cuda.memory_summary``.

    Returns:
        A :class:`MemoryStatus`: ``mode`` says which source it read; ``allocated``, ``peak`` and
        ``reserved`` are bytes (``reserved`` is None without CUDA; all None with nothing to read).
    """
    device = torch.device(device) if device is not None else default_device()
    if meter is None:
        active = threads.following()
        meter = active[-1] if active else None
    if device.type == "cuda":
        status = _cuda_status(device, meter, abbreviated)
        if status is not None:
            return status
    if meter is None:
        return MemoryStatus(NONE_MODE, str(device), None, None, None,
                            f"no statistics on {device}: torch's CPU allocator keeps none (and there is no CUDA "
                            "caching allocator here, so torch.cuda.empty_cache() does nothing). Measure with "
                            "`with MemoryMeter() as meter: ...` and call memory_report(meter)")
    rows = meter.report().rows
    live, peak = sum(r.live for r in rows), sum(r.peak for r in rows)
    text = (f"{METER_MODE} on {device}: {format_bytes(live)} live in tensors (peak {format_bytes(peak)}); no "
            "caching allocator here, so nothing is reserved beyond the live tensors\n" + meter.report().table())
    return MemoryStatus(METER_MODE, str(device), live, peak, None, text)
