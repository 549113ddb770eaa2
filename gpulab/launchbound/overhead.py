"""The fixed cost per op: time per op against the op's size, measured (lab 12).

    python -c "from gpulab.launchbound.overhead import *; t = op_times(); print(overhead_bound_below(t))"

Every eager op pays a fixed cost before any arithmetic: Python, the dispatcher, allocating the
output and, on a GPU, the kernel launch (a few microseconds each). An op on n elements takes
about ``overhead + n · per_element``; the curve is flat for small n and a straight line for
large n. Below the knee, where ``n · per_element`` is smaller than the overhead, the step is
**overhead-bound**: a faster device would not make it faster, fewer ops would. A CPU's
dispatcher shows the same shape as a GPU's launches (Horace He, "Making Deep Learning Go Brrrr
From First Principles", 2022, the "overhead" section).

The sweep goes from 4 to 4M elements on a CPU (:data:`SIZES`), where the knee lies near 16K. A GPU
streams memory so fast that an op of 4M elements can still cost little more than its launch (the
kit's H200 record, ``benchmarks/results/launch_bound-nvidia-h200-x1.json``, measured every size of
the old 4M sweep within 2x of the launch cost: the "knee" was only where the sweep ended), so on
CUDA it goes on to 4^14 elements (:data:`CUDA_SIZES`) and stops early once the time per op grows in
step with the size (:func:`grows_linearly`), or when the next size would not fit in free memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from gpulab.devices.physical import default_device

__all__ = ["OpTiming", "SIZES", "CUDA_SIZES", "sweep_sizes", "grows_linearly", "op_times", "overhead_bound_below",
           "fit_overhead"]

SIZES: tuple[int, ...] = tuple(4**k for k in range(1, 12))  # 4 ... 4M elements: the CPU's sweep
CUDA_SIZES: tuple[int, ...] = tuple(4**k for k in range(1, 15))  # 4 ... 4^14 = 268M elements (1 GiB of float32)


@dataclass(frozen=True)
class OpTiming:
    """Seconds per op of one size (the best of a few loops of ``ops`` back-to-back ops)."""

    numel: int
    seconds: float

    @property
    def ns_per_element(self) -> float:
        return self.seconds / self.numel * 1e9


def _default_op(x: torch.Tensor) -> torch.Tensor:
    return x * 1.0001  # elementwise: 1 FLOP and 8 bytes moved per element


def sweep_sizes(device: torch.device) -> tuple[int, ...]:
    """The default sweep on ``device``: :data:`CUDA_SIZES` on a GPU, :data:`SIZES` elsewhere."""
    return CUDA_SIZES if device.type == "cuda" else SIZES


def grows_linearly(timings: Sequence[OpTiming], steps: int = 2, share: float = 0.75) -> bool:
    """Whether the time per op has grown in step with the size over the last ``steps`` steps of a sweep:
    each step's time ratio at least ``share`` of its size ratio (3x for a 4x step, with the default).
    Past that point the op's own work dominates, and larger sizes add nothing to the knee."""
    if steps < 1 or len(timings) < steps + 1:
        return False
    last = timings[-(steps + 1):]
    return all(b.seconds >= share * (b.numel / a.numel) * a.seconds for a, b in zip(last, last[1:]))


def op_times(sizes: Sequence[int] | None = None, op: Callable[[torch.Tensor], torch.Tensor] = _default_op,
             device: torch.device | None = None, budget_s: float = 0.01, repeats: int = 5,
             threads: int | None = 1, until_linear: bool | None = None) -> list[OpTiming]:
    """Time ``op`` on a float32 tensor of every size in ``sizes``.

    Args:
        sizes: default :func:`sweep_sizes` of the device (4 ... 4M on a CPU, 4 ... 4^14 on a GPU).
        budget_s: roughly how long one loop of back-to-back ops on a size lasts (more ops for
            small sizes, so a microsecond is measurable).
        repeats: loops per size; the best is kept (other programs only ever add time).
        threads: intra-op threads on a CPU while timing (None: leave torch's setting). One by
            default: past about 32K elements an op splits across threads, and on a shared machine
            waiting for a busy core costs milliseconds that are not the op's.
        until_linear: stop after the size where :func:`grows_linearly` first holds. Default: on for
            the default sweep on a GPU, off otherwise (a CPU's sweep is short already). On CUDA the
            sweep also stops before a size whose input and output would not fit in free memory.

    Returns:
        One :class:`OpTiming` per size timed, in the order given.
    """
    device = device or default_device()
    if until_linear is None:
        until_linear = sizes is None and device.type == "cuda"
    sizes = sweep_sizes(device) if sizes is None else sizes
    before = torch.get_num_threads()
    if threads is not None and device.type == "cpu":
        torch.set_num_threads(threads)
    try:
        timings: list[OpTiming] = []
        for n in sizes:
            if device.type == "cuda" and 3 * 4 * int(n) > torch.cuda.mem_get_info(device)[0]:
                break  # the input, the output and the allocator's slack would not fit
            timings.append(_time_size(int(n), op, device, budget_s, repeats))
            if until_linear and grows_linearly(timings):
                break
        return timings
    finally:
        torch.set_num_threads(before)


def _time_size(n: int, op: Callable[[torch.Tensor], torch.Tensor], device: torch.device, budget_s: float,
               repeats: int) -> OpTiming:
    x = torch.randn(n, device=device)
    op(x)  # warm-up: the allocator's first block, lazy initialisation
    t0 = time.perf_counter()
    op(x)
    _sync(device)
    once = max(time.perf_counter() - t0, 1e-6)
    ops = max(1, min(2000, int(budget_s / once)))
    loops = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(ops):
            op(x)
        _sync(device)  # the loop ends when the device does
        loops.append((time.perf_counter() - t0) / ops)
    return OpTiming(n, min(loops))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def overhead_bound_below(timings: Sequence[OpTiming], factor: float = 2.0) -> int:
    """The largest size whose time per op is within ``factor`` x the fixed cost (the floor).

    The fixed cost is the smallest time per op among the three smallest sizes (where nothing but
    the overhead is measured). Sizes are scanned from small to large and the scan stops at the
    first one past the bar, so a noisy dip further on does not count. With ``factor=2`` this is
    the size where the arithmetic takes as long as the overhead.

    Raises:
        ValueError: for no timings or ``factor <= 1``.
    """
    if not timings or factor <= 1:
        raise ValueError(f"need at least one timing and factor > 1, got {len(timings)} timings, factor={factor}")
    ordered = sorted(timings, key=lambda t: t.numel)
    floor = min(t.seconds for t in ordered[:3])
    below = ordered[0].numel
    for t in ordered:
        if t.seconds > factor * floor:
            break
        below = t.numel
    return below


def fit_overhead(timings: Sequence[OpTiming]) -> tuple[float, float]:
    """``(overhead_s, seconds_per_element)``: the floor (as in :func:`overhead_bound_below`), and the
    slope between the two largest sizes."""
    ordered = sorted(timings, key=lambda t: t.numel)
    floor = min(t.seconds for t in ordered[:3])
    if len(ordered) < 2:
        return floor, 0.0
    a, b = ordered[-2], ordered[-1]
    return floor, max(0.0, (b.seconds - a.seconds) / (b.numel - a.numel))
