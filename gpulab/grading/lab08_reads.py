"""Lab 08's count of host reads: how often a training loop reads a tensor's value into Python
(``.item()``, ``float(t)``, ``print(t)``, ``.tolist()``): on a GPU each one is a host-device sync
(lab 01). Exercise 1's test counts them with :func:`count_host_reads` (through
:func:`gpulab.grading.lab08.counted_epoch`); the count is the same on a CPU, where nothing waits.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # a private module; torch has no public path

__all__ = ["count_host_reads"]

# Taken when this module is imported, before any student code runs: what the counter relies on.
_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default  # .item(), float(t), int(t), bool(t), f"{t:.3f}"
_TENSOR = torch.Tensor
_COPIES_OUT = ("tolist", "numpy")  # read a tensor's values without _local_scalar_dense (on a CPU)
_PRINT = torch._tensor_str._str.__code__  # print(t), str(t), repr(t): formatting reads the values


class _ScalarReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense``: every tensor-to-Python-number conversion goes through it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as gpulab.memory.origins: do not import torch._dynamo on the first op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _LOCAL_SCALAR:
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_host_reads(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn(*args, **kwargs)`` and count how often it reads a tensor's value into Python.

    On a GPU each read (``.item()``, ``float(t)``, ``bool(t)``, ``print(t)``, ``.tolist()``,
    ``.numpy()`` after ``.cpu()``) waits for every kernel queued before it: the host-device sync
    that lab 01 measures. The count is the same on a CPU, where nothing waits, so it grades a loop
    without a GPU or a clock. Reads of CPU tensors count too (Adam reads its step counter on a CPU):
    grade with an optimizer that reads nothing, such as SGD.

    Returns:
        ``(whatever fn returned, the number of reads)``.
    """
    reads = _ScalarReads()
    copies = 0
    printing = 0  # depth inside torch's tensor formatting: one print is one read, whatever it calls

    def tracer(frame, event, arg):  # profiler signature
        nonlocal copies, printing
        if frame.f_code is _PRINT and event == "call":
            printing += 1
            copies += printing == 1
        elif frame.f_code is _PRINT and event == "return":
            printing -= 1
        elif (
            event == "c_call"
            and not printing
            and getattr(arg, "__name__", "") in _COPIES_OUT
            and isinstance(getattr(arg, "__self__", None), _TENSOR)
        ):
            copies += 1

    old = sys.getprofile()
    sys.setprofile(tracer)
    try:
        with reads:
            result = fn(*args, **kwargs)
    finally:
        sys.setprofile(old)
    return result, reads.count + copies
