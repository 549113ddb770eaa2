"""find_max_batch_size: the largest batch whose training step fits in memory, by binary search.

"Out of memory? Try batch size 1 first" is the right first move (if even 1 does not fit, the
batch is not the problem), and the search generalises it: try ``lo``, then ``hi``, then halve the
interval, each try a real step. Memory use grows with the batch (activations are linear in it),
so whether a batch fits is monotone and about log2(hi - lo) tries find the largest one. How a try
runs, and what a failed one leaves behind: the comment below the imports.

    best = find_max_batch_size(lambda b: train_step(b), lo=1, hi=1024, budget=64 * 2**20, track=model)

The bisection itself, :func:`bisect_largest`, is gpulab's one batch-size search: lab 05's
:func:`gpulab.parallel.dp.step_memory.largest_batch` doubles up to a failing size and then uses it too.

    .venv/bin/python -m pytest tests/memory/test_batch_size.py
"""

from __future__ import annotations

import gc
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from gpulab.devices import cuda_device_count, default_device
from gpulab.devices.meter import MemoryMeter
from gpulab.devices.meter_report import format_bytes
from gpulab.devices.registry import default_for

# Each try runs under a ``MemoryMeter`` with ``budget=`` (on any machine: the lab's way of having a
# "GPU" of a chosen size) or, with no budget, on the real GPU, where the CUDA allocator raises
# ``torch.OutOfMemoryError``. After a try that failed, what it left is freed: the exception (its
# traceback holds the step's frames and every tensor in them) is dropped, reference cycles are
# collected (``gc.collect``: about 0.1 s with torch loaded, so only after a failure), and on CUDA
# the cached blocks go back (``empty_cache``), so a failure does not make the next try fail too.

__all__ = ["find_max_batch_size", "bisect_largest", "free_memory", "is_out_of_memory", "Try"]

Try = tuple[int, bool, int | None]  # (batch_size, fits, peak bytes measured or None)


# What an out-of-memory looks like when it does not come from torch's caching allocator: cuBLAS and
# cuDNN allocate their own workspaces and handles, and a failure there arrives as a plain RuntimeError
# ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"); so does a cudaMalloc
# outside the allocator ("CUDA error: out of memory"). cuDNN reports a failed handle creation under
# memory pressure as CUDNN_STATUS_NOT_INITIALIZED (a broken install says the same: a retry that still
# fails then raises it unchanged).
_OOM_SIGNS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_NOT_INITIALIZED")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` means the device ran out of memory: ``torch.OutOfMemoryError``, or a
    ``RuntimeError`` from cuBLAS, cuDNN or CUDA itself that says so (see ``_OOM_SIGNS``)."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(sign in str(err) for sign in _OOM_SIGNS)


def free_memory(device: torch.device | str | None = None) -> None:
    """Free what unreachable tensors still hold: collect reference cycles and, on CUDA, give the
    caching allocator's free blocks back (``torch.cuda.empty_cache``; it never frees live tensors)."""
    gc.collect()
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda" and cuda_device_count() > 0:
        torch.cuda.empty_cache()


def _check_args(step_fn: Any, lo: Any, hi: Any, budget: Any) -> None:
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a function step_fn(batch_size) that runs one step, got {type(step_fn).__name__}")
    for name, v in (("lo", lo), ("hi", hi)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1 (a batch size), got {v!r}")
    if lo > hi:
        raise ValueError(f"lo={lo} > hi={hi}: the search interval is empty; pass lo <= hi "
                         f"(swapped? lo={hi}, hi={lo})")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ValueError(f"budget is bytes, a positive int (e.g. 64 * 2**20) or None for the real GPU; got {budget!r}")


def find_max_batch_size(step_fn: Callable[[int], Any], lo: int, hi: int, budget: int | None = None, *,
                        track: Any = None, device: torch.device | str | None = None,
                        log: list[Try] | None = None, disable: bool = False) -> int:
    """The largest batch size in ``[lo, hi]`` for which ``step_fn(batch_size)`` fits in memory.

    Args:
        step_fn: runs one full step (make the batch, forward, backward) for a batch size. It
            should leave nothing behind (return nothing; drop gradients with
            ``zero_grad(set_to_none=True)`` or pass the model as ``track``), so each try is alike.
        lo, hi: the interval searched (batch sizes, ``1 <= lo <= hi``).
        budget: bytes of memory. Each try runs under ``MemoryMeter(budget)``. None: on the real
            GPU (needs CUDA).
        track: a module or tensors made before (the model) that count against the budget, as
            the model's weights do on a GPU.
        device: the device the step runs on (default: the GPU, else the CPU).
        log: a list to which ``(batch_size, fits, peak_bytes)`` is appended per try.
        disable: no tqdm progress bar (one tick per try).

    Returns:
        The largest batch size that fits (``hi`` if ``hi`` fits: the true maximum may be larger).

    Raises:
        ValueError: for ``lo > hi``, a bad ``lo``/``hi``/``budget``, no budget on a machine
            without a GPU, or when even ``lo`` does not fit (the message gives the sizes).
        TypeError: if ``step_fn`` is not callable.
        Exception: whatever ``step_fn`` raises other than ``torch.OutOfMemoryError``, unchanged.

    Warning:
        Under a budget only memory on ``device`` counts: on a GPU machine, a step that makes its
        tensors on the CPU never runs out, and the answer is ``hi``. On a real GPU, memory held
        outside the step (an earlier cell's tensors, another process) counts too, and
        fragmentation can make a size that fitted alone fail later: keep a margin.
    """
    _check_args(step_fn, lo, hi, budget)
    device = torch.device(device) if device is not None else default_device()
    if budget is None and not (device.type == "cuda" and cuda_device_count() > 0):
        raise ValueError(f"no budget= and no GPU ({device}): there is no memory limit to search against. Pass "
                         "budget=<bytes> to search under a MemoryMeter, e.g. budget=64 * 2**20")
    bar = tqdm(total=max(1, (hi - lo).bit_length() + 2), desc="max batch size", disable=disable, leave=False)

    def fits(batch_size: int) -> bool:
        ok, peak, detail = _try(step_fn, batch_size, budget, track, device)
        if log is not None:
            log.append((batch_size, ok, peak))
        bar.update(1)
        bar.set_postfix(batch=batch_size, fits=ok)
        if not ok and batch_size == lo:
            bar.close()
            where = f"a budget of {format_bytes(budget)}" if budget is not None else f"the memory of {device}"
            raise ValueError(f"even batch_size=lo={lo} does not fit in {where}: {detail}. Raise budget=, use a "
                             "smaller model or inputs, or look for a leak (memory held before the step)")
        return ok

    try:
        if not fits(lo):  # pragma: no cover - fits() raises for lo
            return lo
        if lo == hi or fits(hi):
            return hi
        return bisect_largest(fits, lo, hi)
    finally:
        bar.close()


def bisect_largest(fits: Callable[[int], Any], good: int, bad: int, multiple: int = 1) -> int:
    """The largest size in ``[good, bad)`` (a multiple of ``multiple``) with ``fits(size)``, by bisection.

    ``fits(good)`` is known to hold and ``fits(bad)`` to fail; memory grows with the batch, so
    ``fits`` holds up to some size and fails above it, and about ``log2((bad - good) / multiple)``
    calls find that size.

    Args:
        fits: ``fits(batch_size) -> bool``.
        good: a size that fits (a multiple of ``multiple``).
        bad: a larger size that does not (a multiple of ``multiple``).
        multiple: try multiples of this only.
    """
    while bad - good > multiple:  # invariant: fits(good), not fits(bad)
        mid = (good + bad) // 2 // multiple * multiple
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def _try(step_fn: Callable[[int], Any], batch_size: int, budget: int | None, track: Any,
         device: torch.device) -> tuple[bool, int | None, str]:
    """Run one step; (fits, peak bytes if it fitted, the first line of the OOM message if not)."""
    try:
        if budget is not None:
            dev = default_for(device)
            meter = MemoryMeter(budget, timeline=False)
            if track is not None:
                meter.track(track, dev)  # the model alone may not fit: an OutOfMemoryError too
            with meter:
                step_fn(batch_size)
            return True, meter.peak(dev), ""
        torch.cuda.reset_peak_memory_stats(device)
        step_fn(batch_size)
        torch.cuda.synchronize(device)  # an asynchronous kernel may still fail
        return True, int(torch.cuda.max_memory_allocated(device)), ""
    except RuntimeError as err:  # torch.OutOfMemoryError is one; cuBLAS/cuDNN OOMs are plain ones
        if not is_out_of_memory(err):
            raise
        detail = str(err).splitlines()[0].rstrip(".")
    # Out of the except block: the exception and its traceback (which holds the step's frames,
    # and every tensor in them) are gone, so this frees them.
    free_memory(device)
    return False, None, detail
