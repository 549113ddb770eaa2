"""All-gather and reduce-scatter along one dimension, differentiable (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_gather.py

Two more conjugate pairs, beside ``f``/``g`` (:mod:`gpulab.parallel.tp.conjugate`):

- :class:`GatherFromParallel`: forward all-gathers the ranks' pieces along ``dim``; backward keeps
  this rank's slice of the gradient. A column-parallel layer with ``gather_output=True`` ends
  with it (the naive way: every layer's output made whole again, one all-gather per layer).
- sequence parallelism (Korthikanti et al. 2022) keeps the block's input and output split along
  the sequence: :class:`GatherFromSequence` (all-gather forward, reduce-scatter backward: the
  column layer's input gradient is a partial sum on every rank) before the column layer, and
  :class:`ReduceScatterToSequence` (reduce-scatter forward, all-gather backward) after the row layer.

``dim`` must divide evenly by the world size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GatherFromParallel", "GatherFromSequence", "ReduceScatterToSequence", "gather_from_parallel",
           "gather_from_sequence", "reduce_scatter_to_sequence"]


def _all_gather(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)  # (.., N * x.size(dim), ..)


def _own_slice(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if x.size(dim) % world_size:
        raise ValueError(f"dimension {dim} has size {x.size(dim)}, not divisible by {world_size} ranks; "
                         f"pad it to a multiple of {world_size}")
    return x.chunk(world_size, dim=dim)[rank].contiguous()


class GatherFromParallel(torch.autograd.Function):
    """All-gather forward along ``dim``; backward: this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int = -1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _own_slice(grad, ctx.dim, ctx.group), None, None


def _reduce_scatter(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    world_size = dist.get_world_size(group)
    if x.size(dim) % world_size:
        raise ValueError(f"dimension {dim} has size {x.size(dim)}, not divisible by {world_size} ranks; "
                         f"pad it to a multiple of {world_size}")
    pieces = [p.contiguous() for p in x.chunk(world_size, dim=dim)]
    out = torch.empty_like(pieces[0])
    dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM, group=group)
    return out  # (.., x.size(dim) / N, ..): the sum over ranks of this rank's slice


class GatherFromSequence(torch.autograd.Function):
    """All-gather forward along ``dim``; backward: reduce-scatter (the gradient is a partial sum per rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int = 1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _reduce_scatter(grad, ctx.dim, ctx.group), None, None


class ReduceScatterToSequence(torch.autograd.Function):
    """Reduce-scatter forward along ``dim`` (sum over ranks, keep this rank's slice); backward: all-gather."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int = 1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather(grad, ctx.dim, ctx.group), None, None


def gather_from_parallel(x: torch.Tensor, dim: int = -1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """See :class:`GatherFromParallel`."""
    return GatherFromParallel.apply(x, dim, group)


def gather_from_sequence(x: torch.Tensor, dim: int = 1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """See :class:`GatherFromSequence`."""
    return GatherFromSequence.apply(x, dim, group)


def reduce_scatter_to_sequence(x: torch.Tensor, dim: int = 1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """See :class:`ReduceScatterToSequence`."""
    return ReduceScatterToSequence.apply(x, dim, group)
