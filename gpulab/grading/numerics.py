"""Graded runs compute as the CPU does: IEEE float32 and deterministic kernels, also on a GPU.

A GPU's defaults trade exactness for speed: float32 convolutions run in TF32 (a 10-bit mantissa,
``torch.backends.cudnn.allow_tf32``), and cuDNN may pick backward kernels that add with atomics,
in a different order on each run. On an H200 two runs of the same 9-step epoch of lab 08's CNN
ended with weights 1e-4 apart, 100 times the tolerance that tells a right answer from a wrong one.
So the graders run the student's code and the reference's inside :func:`exact_float32`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["exact_float32"]


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Inside the block: float32 matrix products and convolutions in IEEE float32, no TF32
    (``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` False), and
    cuDNN's deterministic algorithms (``cudnn.deterministic`` True, ``cudnn.benchmark`` False);
    then every setting as it was. The settings are the process's, every thread's; on a CPU they
    change nothing."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = saved
