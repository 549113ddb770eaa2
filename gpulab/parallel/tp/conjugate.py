"""The two conjugate operators of tensor parallelism: ``f`` and ``g`` of Megatron-LM (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_conjugate.py    # 2 and 4 gloo ranks

Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism" (2019), split a layer's matrix multiply over ranks and glue the pieces with two
operators that are each other's transpose:

- ``f`` = :class:`CopyToParallel`: identity forward (every rank already holds the full input),
  all-reduce backward (each rank's piece of the layer contributes to the input's gradient, so
  the pieces are summed);
- ``g`` = :class:`ReduceFromParallel`: all-reduce forward (each rank holds a partial sum of the
  output), identity backward (the output is replicated, so every rank already has its gradient).

A column-parallel layer starts with ``f``; a row-parallel layer ends with ``g``. An MLP of the
two costs one all-reduce forward (``g``) and one backward (``f``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CopyToParallel", "ReduceFromParallel", "copy_to_parallel", "reduce_from_parallel"]


class CopyToParallel(torch.autograd.Function):
    """``f``: identity forward, all-reduce (sum) of the gradient backward.

    Warning:
        Backward is called only when the input requires grad. A block's input that does not
        (the first layer's data) skips the all-reduce, which is right: nothing needs that
        gradient. Counting collectives on such an input finds one fewer.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # autograd never builds one (apply is a class
        super().__init__(*args, **kwargs)  # method); kept so that masking the class masks building it too

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)  # a new tensor object for autograd, the same memory

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()  # all_reduce works in place; autograd may still hold grad elsewhere
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


class ReduceFromParallel(torch.autograd.Function):
    """``g``: all-reduce (sum) forward, identity backward."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # as CopyToParallel's
        super().__init__(*args, **kwargs)

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
        out = x.clone()  # never reduce into the caller's tensor: autograd saved it
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_parallel(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``f(x)``: see :class:`CopyToParallel`."""
    return CopyToParallel.apply(x, group)


def reduce_from_parallel(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``g(x)``: see :class:`ReduceFromParallel`."""
    return ReduceFromParallel.apply(x, group)
