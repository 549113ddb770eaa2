"""What a MemoryMeter measured, as a table, a bar chart, and a CUDA-shaped out-of-memory message.

Figures are bytes of tensor storage per logical device (what ``Tensor.untyped_storage().nbytes()``
says). On a real GPU, the CUDA caching allocator rounds every block up (to 512 bytes, and 2 MiB
segments) and keeps freed blocks reserved, so its own statistics (``torch.cuda.memory_stats``),
shown beside ours, are a little higher. On a CPU-only machine that call returns nothing and
``torch.cuda.memory_summary()`` raises ``KeyError``, so neither is used there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gpulab.devices.logical import LogicalDevice
from gpulab.devices.physical import cuda_device_count

__all__ = ["DeviceMemory", "MemoryReport", "format_bytes", "plot_timeline"]


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``, as CUDA's messages write sizes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} bytes"


def _cuda_allocator_stats(physical: torch.device) -> dict[str, int] | None:
    """The CUDA allocator's current/peak allocated and reserved bytes on ``physical``; None on a
    CPU device or where CUDA is not usable (``memory_stats`` is empty there)."""
    if physical.type != "cuda":
        return None
    try:
        if cuda_device_count() == 0:
            return None
        stats = torch.cuda.memory_stats(physical)
    except Exception:  # a broken driver must not break a report
        return None
    if not stats:
        return None
    return {
        "allocated": int(stats.get("allocated_bytes.all.current", 0)),
        "peak_allocated": int(stats.get("allocated_bytes.all.peak", 0)),
        "reserved": int(stats.get("reserved_bytes.all.current", 0)),
    }


def _cuda_line(physical: torch.device, stats: dict[str, int]) -> str:
    return (f"CUDA allocator on {physical}: {format_bytes(stats['allocated'])} allocated "
            f"(peak {format_bytes(stats['peak_allocated'])}), {format_bytes(stats['reserved'])} reserved")


def _oom_message(device: LogicalDevice, nbytes: int, live: int, budget: int) -> str:
    """The text of the ``torch.OutOfMemoryError`` a budget raises, shaped like CUDA's."""
    where = f"{device} (simulated on {device.physical})" if device.simulated else f"{device} ({device.physical})"
    lines = [
        f"MemoryMeter out of memory. Tried to allocate {format_bytes(nbytes)}. {where} has a budget of "
        f"{format_bytes(budget)} of which {format_bytes(max(budget - live, 0))} is free. Of the budget, "
        f"{format_bytes(live)} is allocated by live tensors.",
    ]
    stats = _cuda_allocator_stats(device.physical)
    if stats:
        lines.append(_cuda_line(device.physical, stats) + ".")
    lines.append("To fit: use a smaller batch, keep fewer tensors alive (del them, use loss.item(), "
                 "torch.no_grad() for evaluation), balance the work over the devices, or raise budget=.")
    return "\n".join(lines)


@dataclass(frozen=True)
class DeviceMemory:
    """One row of a report: bytes of tensor storage on one logical device."""

    device: LogicalDevice
    live: int  # allocated now (at exit, once the meter has exited)
    peak: int  # the most that was live at once (since entry or reset_peak)
    allocated: int  # everything allocated while metered, freed or not
    budget: int | None


@dataclass
class MemoryReport:
    """What :meth:`MemoryMeter.report` returns. Printing it (or leaving it last in a notebook
    cell) shows the table; :meth:`plot` draws peak and live bytes per device."""

    rows: list[DeviceMemory]
    budget: int | None = None
    cuda: dict[str, dict[str, int]] = field(default_factory=dict)  # physical -> allocator stats

    @property
    def imbalance(self) -> float:
        """Largest peak over smallest peak (1.0 is perfectly balanced; inf if a device is unused)."""
        peaks = [r.peak for r in self.rows]
        if not peaks or max(peaks) == 0:
            return 1.0
        return max(peaks) / min(peaks) if min(peaks) > 0 else float("inf")

    @property
    def simulated(self) -> bool:
        """True if any device shares its physical device (the figures are gpulab's accounting)."""
        return any(r.device.simulated for r in self.rows) or (
            len({r.device.physical for r in self.rows}) < len(self.rows))

    def mode(self) -> str:
        """One line on what the figures are."""
        if not self.rows:
            return "nothing was allocated while metered"
        if self.simulated:
            phys = ", ".join(sorted({str(r.device.physical) for r in self.rows}))
            return (f"simulated: {len(self.rows)} logical devices share {phys}; bytes of tensor storage "
                    "counted per logical device by gpulab (not a hardware measurement)")
        return "real devices: bytes of tensor storage per device, counted by gpulab"

    def table(self) -> str:
        """The report as aligned text."""
        out = [f"MemoryMeter ({self.mode()})"]
        names = [repr(r.device) for r in self.rows]
        width = max([len("device")] + [len(n) for n in names])
        out.append(f"{'device':<{width}}  {'live':>11}  {'peak':>11}  {'allocated':>11}  {'budget':>11}")
        for name, r in zip(names, self.rows):
            budget = format_bytes(r.budget) if r.budget is not None else "-"
            out.append(f"{name:<{width}}  {format_bytes(r.live):>11}  {format_bytes(r.peak):>11}  "
                       f"{format_bytes(r.allocated):>11}  {budget:>11}")
        if len(self.rows) > 1:
            out.append(f"imbalance (largest peak / smallest peak): {self.imbalance:.2f}")
        for phys, stats in self.cuda.items():
            out.append(_cuda_line(torch.device(phys), stats))
        return "\n".join(out)

    __str__ = table

    def __repr__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers (for JSON or a graded check)."""
        return {
            "mode": self.mode(),
            "imbalance": self.imbalance,
            "devices": {str(r.device): {"live": r.live, "peak": r.peak, "allocated": r.allocated}
                        for r in self.rows},
            "budget": self.budget,
            "cuda": self.cuda,
        }

    def plot(self, ax: Any = None, title: str | None = None) -> Any:
        """Bars of peak and live MiB per device, with the budget as a dashed line.

        Args:
            ax: a matplotlib Axes to draw on; a new figure when None.
            title: the title; by default the imbalance.

        Returns:
            The Axes.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(1.2 * max(len(self.rows), 3) + 2, 3.2))
        x = range(len(self.rows))
        mib = 2**20
        ax.bar([i - 0.2 for i in x], [r.peak / mib for r in self.rows], 0.4, label="peak")
        ax.bar([i + 0.2 for i in x], [r.live / mib for r in self.rows], 0.4, label="live")
        if self.budget is not None:
            ax.axhline(self.budget / mib, color="red", linestyle="--", label="budget")
        ax.set_xticks(list(x), [str(r.device) for r in self.rows])
        ax.set_ylabel("MiB")
        ax.set_title(title or f"memory per device (imbalance {self.imbalance:.2f})"
                     + (", simulated" if self.simulated else ""))
        ax.legend()
        return ax


def plot_timeline(events: list[tuple[float, LogicalDevice, int]], devices: list[LogicalDevice],
                  budget: int | None = None, truncated: bool = False, ax: Any = None) -> Any:
    """Live MiB per device over time (a step line each), the budget dashed.

    Args:
        events: ``(seconds, device, live bytes)`` as ``MemoryMeter.timeline()`` returns them.
        devices: the devices to draw, in order.
        budget: bytes per device, drawn as a line.
        truncated: whether events past the cap were dropped (said on the axis).
        ax: a matplotlib Axes; a new figure when None.

    Returns:
        The Axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    for dev in devices:
        pts = [(t, live / 2**20) for t, d, live in events if d == dev]
        if pts:
            ax.step([0.0] + [t for t, _ in pts], [0.0] + [m for _, m in pts], where="post", label=str(dev))
    if budget is not None:
        ax.axhline(budget / 2**20, color="red", linestyle="--", label="budget")
    ax.set_xlabel("seconds since entering the meter" + (" (later events dropped)" if truncated else ""))
    ax.set_ylabel("live MiB")
    ax.legend(loc="upper left", fontsize="small")
    return ax
