"""Model FLOPs utilisation over the measured matmul peak: a step's FLOP/s over what this device's best matmul reaches (lab 12).

    python -c "from gpulab.launchbound.mfu import measure_peak; print(measure_peak())"

PaLM's MFU (Chowdhery et al. 2022, https://arxiv.org/abs/2204.02311, appendix B) divides the
model's FLOPs per second by the hardware's **theoretical** peak: the datasheet's figure, which no
program reaches. This module divides by a peak **measured in the same run**, by the largest matmul
that is cheap to time, in the precision in force (a CPU has no datasheet; a GPU's is shown beside,
labelled as such, dense, no sparsity). The figure is therefore "model FLOPs utilisation over the
measured matmul peak": higher than PaLM's MFU of the same run, by the datasheet's peak over the
measured one.

The precision is named: a float32 matmul on a GPU runs on TF32 tensor cores when
``torch.backends.cuda.matmul.fp32_precision`` is ``"tf32"`` (``allow_tf32``, or
``torch.set_float32_matmul_precision("high")``, in the older API), and as IEEE float32 otherwise
(torch's default); :class:`Peak` says "TF32" when it was on, and the datasheet figure it quotes is
then the TF32 one.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from gpulab.devices.physical import default_device

__all__ = ["Peak", "Mfu", "DATASHEET_TFLOPS", "datasheet_part", "datasheet_tflops", "tf32_matmul", "measure_peak",
           "measure_mfu", "time_call", "per_call_interleaved"]

# Dense TFLOP/s (no sparsity) from NVIDIA's product pages, by part and dtype: what a label may quote,
# never a measurement. The pages list TF32 and BF16 "with sparsity": half of that is the dense figure.
#   H200, H200 NVL: https://www.nvidia.com/en-us/data-center/h200/
#   H100 (SXM), H100 NVL: https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe: the 2022 edition of
#     that page and of NVIDIA's H100 datasheet: 51 FP32, 756 TF32 and 1,513 BF16 with sparsity)
#   A100 (SXM and PCIe alike): https://www.nvidia.com/en-us/data-center/a100/
#   V100 (SXM2), V100 PCIe: https://www.nvidia.com/en-us/data-center/v100/
# A name matches a part when every word of the part is a word of the name; the part with the most
# words wins, so "NVIDIA H100 PCIe" gets the PCIe figures, not the SXM ones of "H100".
DATASHEET_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4},
    "H200 NVL": {"float32": 60.0, "tf32": 417.5, "bfloat16": 835.5},
    "H100": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4},
    "H100 PCIE": {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.5},
    "H100 NVL": {"float32": 60.0, "tf32": 417.5, "bfloat16": 835.5},
    "A100": {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0},
    "V100": {"float32": 15.7, "float16": 125.0},
    "V100 PCIE": {"float32": 14.0, "float16": 112.0},
}


def _words(name: str) -> set[str]:
    return set(re.findall(r"[A-Z0-9]+", name.upper()))


def datasheet_part(device_name: str) -> str | None:
    """The most specific part of :data:`DATASHEET_TFLOPS` that ``device_name`` names, or None.

    Words are matched whole (``"H100"`` is not in ``"GH100"``), and the part with the most words wins:
    ``"NVIDIA H100 PCIe"`` is ``"H100 PCIE"``, ``"NVIDIA H100 80GB HBM3"`` (an SXM part) is ``"H100"``.
    """
    words = _words(device_name)
    parts = [part for part in DATASHEET_TFLOPS if _words(part) <= words]
    return max(parts, key=lambda part: len(_words(part)), default=None)


def datasheet_tflops(device_name: str, dtype: str = "float32") -> float | None:
    """The datasheet's dense TFLOP/s for a GPU name such as ``"NVIDIA H100 80GB HBM3"`` and a dtype
    (``"float32"``, ``"tf32"``, ``"bfloat16"``, ``"float16"``), or None where the part or the dtype is not listed."""
    part = datasheet_part(device_name)
    return DATASHEET_TFLOPS[part].get(dtype) if part else None


def tf32_matmul() -> bool:
    """Whether a float32 matmul on CUDA runs on TF32 tensor cores now (the setting in force, not the
    device's ability): ``torch.backends.cuda.matmul.fp32_precision``, else the global
    ``torch.backends.fp32_precision``, else the older ``allow_tf32`` flag."""
    matmul = torch.backends.cuda.matmul
    for precision in (getattr(matmul, "fp32_precision", None), getattr(torch.backends, "fp32_precision", None)):
        if precision in ("tf32", "ieee"):
            return precision == "tf32"
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:  # torch refuses to read it when the old and new APIs were mixed; the new one said nothing
        return False


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
    """The device's measured matmul FLOP/s, in the precision it ran, and the datasheet's where one is known.

    ``tf32`` is True when the float32 matmul ran on TF32 tensor cores (:func:`tf32_matmul`): the label
    then says so, and the datasheet figure is the TF32 one.
    """

    flops_per_s: float
    n: int
    dtype: str
    device: str
    datasheet_flops_per_s: float | None = None
    tf32: bool = False

    @property
    def precision(self) -> str:
        """The math the matmul ran: its dtype, or "float32 with TF32" on TF32 tensor cores."""
        return f"{self.dtype} with TF32" if self.tf32 else self.dtype

    def __str__(self) -> str:
        sheet = (f"; datasheet (dense {'TF32' if self.tf32 else self.dtype}): {self.datasheet_flops_per_s / 1e12:.1f} TFLOP/s"
                 if self.datasheet_flops_per_s else "")
        return (f"measured peak {self.flops_per_s / 1e9:.1f} GFLOP/s ({self.n}x{self.n} {self.precision} matmul "
                f"on {self.device}){sheet}")


def measure_peak(device: torch.device | None = None, n: int | None = None, dtype: torch.dtype = torch.float32,
                 repeats: int = 5) -> Peak:
    """The FLOP/s of an ``n x n`` matmul (2·n³ FLOPs), the best of ``repeats``: this device's peak in
    ``dtype`` (float32: IEEE, or TF32 on a GPU where :func:`tf32_matmul` says it is on).

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
    label = str(dtype).removeprefix("torch.")
    tf32 = device.type == "cuda" and dtype == torch.float32 and tf32_matmul()
    sheet = datasheet_tflops(name, "tf32" if tf32 else label) if device.type == "cuda" else None
    return Peak(2 * n**3 / best, n, label, name, sheet * 1e12 if sheet else None, tf32)


@dataclass
class Mfu:
    """One step's model FLOPs utilisation over the measured peak: its FLOPs, its best time, and the peak."""

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
