"""The roofline: arithmetic intensity against the machine's balance point, measured (lab 12).

    python -c "from gpulab.launchbound.roofline import *; print(measure_bandwidth())"

A kernel that does F FLOPs and moves B bytes has arithmetic intensity ``F / B``. The machine can
do at most ``min(peak, intensity x bandwidth)`` FLOP/s on it. The **balance point** ``peak /
bandwidth`` (FLOPs per byte) separates the memory-bound kernels (left of it) from the
compute-bound ones (right). A matmul of a batch of b rows by a d x d weight does 2·b·d² FLOPs
over about 4·(2·b·d + d²) bytes: its intensity grows with b, which is why a bigger batch is the
other lever (Williams, Waterman and Patterson, "Roofline: an insightful visual performance model
for multicore architectures", CACM 2009).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from gpulab.devices.physical import default_device
from gpulab.launchbound.mfu import time_call

__all__ = ["Kernel", "arithmetic_intensity", "machine_balance", "attainable", "measure_bandwidth", "matmul_kernel",
           "elementwise_kernel", "plot_roofline"]


@dataclass
class Kernel:
    """One measured kernel: its FLOPs, bytes moved, and seconds per call."""

    name: str
    flops: float
    bytes: float
    seconds: float

    @property
    def intensity(self) -> float:
        return arithmetic_intensity(self.flops, self.bytes)

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved. Raises ValueError for ``nbytes <= 0``."""
    if nbytes <= 0:
        raise ValueError(f"bytes moved must be positive, got {nbytes}")
    return flops / nbytes


def machine_balance(peak_flops_per_s: float, bytes_per_s: float) -> float:
    """The intensity (FLOPs per byte) at which the memory roof meets the compute roof."""
    return peak_flops_per_s / bytes_per_s


def attainable(intensity: float, peak_flops_per_s: float, bytes_per_s: float) -> float:
    """The roof over ``intensity``: ``min(peak, intensity x bandwidth)`` FLOP/s."""
    return min(peak_flops_per_s, intensity * bytes_per_s)


def measure_bandwidth(device: torch.device | None = None, numel: int | None = None, repeats: int = 5) -> float:
    """Bytes per second of a large copy (each element read once and written once): by default
    64 MiB moved on a CPU, 1 GiB on a GPU (past an H100's 50 MB L2 cache)."""
    device = device or default_device()
    numel = numel or (2**27 if device.type == "cuda" else 2**23)
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    seconds = min(time_call(lambda: dst.copy_(src), device, repeats=1) for _ in range(repeats))
    return 2 * src.nbytes / seconds


def matmul_kernel(batch_size: int, d: int, device: torch.device | None = None, repeats: int = 5) -> Kernel:
    """Time ``x @ w`` for x of (batch_size, d) and w of (d, d), float32."""
    device = device or default_device()
    x, w = torch.randn(batch_size, d, device=device), torch.randn(d, d, device=device)
    seconds = time_call(lambda: x @ w, device, repeats=repeats)
    return Kernel(f"matmul b={batch_size}", 2 * batch_size * d * d, 4 * (2 * batch_size * d + d * d), seconds)


def elementwise_kernel(numel: int, device: torch.device | None = None, repeats: int = 5) -> Kernel:
    """Time ``torch.add(x, x, alpha=0.5)`` (x + 0.5·x): 2 FLOPs per element over 12 bytes (the
    two operands read, the result written), counted as if nothing stayed in a cache."""
    device = device or default_device()
    x = torch.randn(numel, device=device)
    seconds = time_call(lambda: torch.add(x, x, alpha=0.5), device, repeats=repeats)
    return Kernel(f"add n={numel}", 2 * numel, 12 * numel, seconds)


def plot_roofline(kernels: Sequence[Kernel], peak_flops_per_s: float, bytes_per_s: float, ax: Any = None,
                  title: str = "") -> Any:
    """The roof (log-log) with every kernel as a point at (intensity, achieved FLOP/s)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    lo = min([k.intensity for k in kernels] + [0.05]) / 2
    hi = max([k.intensity for k in kernels] + [machine_balance(peak_flops_per_s, bytes_per_s)]) * 4
    xs = [lo * (hi / lo) ** (i / 99) for i in range(100)]
    ax.loglog(xs, [attainable(x, peak_flops_per_s, bytes_per_s) for x in xs], "k-", label="roof (measured)")
    ax.axvline(machine_balance(peak_flops_per_s, bytes_per_s), color="grey", ls=":", label="balance point")
    for k in kernels:
        ax.loglog([k.intensity], [k.flops_per_s], "o", label=k.name)
    ax.set(xlabel="arithmetic intensity (FLOPs / byte)", ylabel="FLOP/s", title=title)
    ax.legend(fontsize="x-small")
    return ax
