"""MFU, model FLOPs utilisation: the FLOP/s a step achieves over the FLOP/s the device can do (lab 12).

    python -c "from gpulab.launchbound.mfu import measure_peak; print(measure_peak())"

The peak is **measured in the same run**, by the largest matmul that is cheap to time: no
hardware reaches its datasheet figure, and a CPU has none. On a GPU the datasheet figure is shown
beside it, labelled as such (dense, no sparsity). MFU is the PaLM paper's measure (Chowdhery et
al. 2022, appendix B): the model's FLOPs per step, divided by the step's time and the peak.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from gpulab.devices.physical import default_device

__all__ = ["Peak", "Mfu", "DATASHEET_TFLOPS", "datasheet_tflops", "measure_peak", "measure_mfu", "time_call",
           "per_call_interleaved"]

# Dense TFLOP/s from NVIDIA's datasheets (SXM parts), by dtype: what a label may quote, never a measurement.
DATASHEET_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4},
    "H100": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4},
    "A100": {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0},
    "V100": {"float32": 15.7, "float16": 125.0},
}


def datasheet_tflops(device_name: str, dtype: str = "float32") -> float | None:
    """The datasheet's dense TFLOP/s for a GPU name such as ``"NVIDIA H100 80GB HBM3"``, or None."""
    for part, figures in DATASHEET_TFLOPS.items():
        if part in device_name.upper():
            return figures.get(dtype)
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, each ended by a device sync."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)  # queued GPU work counts
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_call_interleaved(fns: dict[str, Callable[[], Any]], device: torch.device, calls: int = 100,
                         repeats: int = 5) -> dict[str, float]:
    """Seconds per call of each function: the best of ``repeats`` loops of ``calls`` calls, the
    functions taking turns (A B A B ...), so that a burst of other work on a shared machine slows
    every side alike instead of one."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(device)  # queued GPU work counts
            best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    return best


@dataclass
class Peak:
    """The device's measured matmul FLOP/s, and the datasheet's where one is known."""

    flops_per_s: float
    n: int
    dtype: str
    device: str
    datasheet_flops_per_s: float | None = None

    def __str__(self) -> str:
        sheet = (f"; datasheet (dense {self.dtype}): {self.datasheet_flops_per_s / 1e12:.1f} TFLOP/s"
                 if self.datasheet_flops_per_s else "")
        return f"measured peak {self.flops_per_s / 1e9:.1f} GFLOP/s ({self.n}x{self.n} {self.dtype} matmul on {self.device}){sheet}"


def measure_peak(device: torch.device | None = None, n: int | None = None, dtype: torch.dtype = torch.float32,
                 repeats: int = 5) -> Peak:
    """The FLOP/s of an ``n x n`` matmul (2·n³ FLOPs), the best of ``repeats``: this device's peak.

    Args:
        device: default :func:`gpulab.devices.default_device`.
        n: the matrix side; default 1024 on a CPU (about 0.1 s on 2 cores), 8192 on a GPU.
    """
    device = device or default_device()
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = min(time_call(lambda: a @ b, device, repeats=1) for _ in range(repeats))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sheet = datasheet_tflops(name, str(dtype).removeprefix("torch.")) if device.type == "cuda" else None
    return Peak(2 * n**3 / best, n, str(dtype).removeprefix("torch."), name, sheet * 1e12 if sheet else None)


@dataclass
class Mfu:
    """One step's MFU: its FLOPs, its median time, and the peak it is measured against."""

    flops: int
    seconds: float
    peak_flops_per_s: float

    @property
    def achieved(self) -> float:
        """FLOP/s the step achieved."""
        return self.flops / self.seconds

    @property
    def mfu(self) -> float:
        return self.achieved / self.peak_flops_per_s

    def __str__(self) -> str:
        return f"{self.achieved / 1e9:.2f} GFLOP/s in {self.seconds * 1e3:.2f} ms: MFU {self.mfu:.1%}"


def measure_mfu(step: Callable[[], Any], flops: int, peak: Peak | float, device: torch.device | None = None,
                repeats: int = 5) -> Mfu:
    """Time ``step()`` (the best of ``repeats``, as the peak is) and divide its ``flops`` per second by ``peak``.

    Raises:
        ValueError: for a non-positive ``flops`` or peak.
    """
    peak_fps = peak.flops_per_s if isinstance(peak, Peak) else float(peak)
    if flops <= 0 or peak_fps <= 0:
        raise ValueError(f"flops and the peak must be positive, got {flops} and {peak_fps}")
    device = device or default_device()
    seconds = min(time_call(step, device, repeats=1, warmup=1 if i == 0 else 0) for i in range(repeats))
    return Mfu(int(flops), seconds, peak_fps)
