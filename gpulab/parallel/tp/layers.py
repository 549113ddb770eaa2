"""Column- and row-parallel linear layers: one ``nn.Linear`` split over ranks (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_layers.py       # 2 and 4 gloo ranks

``nn.Linear`` computes ``y = x @ W.T + b`` with ``W`` of shape ``(out, in)``. Split ``W`` over N ranks:

- **by output features** (:class:`ColumnParallelLinear`, "column" of ``W.T``): rank r holds rows
  ``W[r*out/N:(r+1)*out/N]`` and that slice of the bias, and computes its slice of ``y``. It needs
  the full input (``f``: identity forward, all-reduce of the input's gradient backward).
- **by input features** (:class:`RowParallelLinear`): rank r holds columns ``W[:, r*in/N:...]``,
  takes its slice of the input and computes a partial sum of the full ``y``; ``g`` all-reduces
  the partial sums, then the (replicated) bias is added once.

Column then row needs no communication between them: the column layer's output slice *is* the
row layer's input slice (Megatron-LM, Shoeybi et al. 2019). ``gather_output=True`` is the naive
way: an all-gather after every column layer, the full activation on every rank. ``from_linear``
slices a full ``nn.Linear``: each rank holds 1/N of the weight and the pair computes what it does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from gpulab.parallel.tp.conjugate import copy_to_parallel, reduce_from_parallel
from gpulab.parallel.tp.gather import gather_from_parallel

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "shard_size"]


def shard_size(features: int, world_size: int, what: str = "features") -> int:
    """``features // world_size``, or a ``ValueError`` naming the fix when it does not divide."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if features % world_size:
        raise ValueError(f"{what}={features} is not divisible by world_size={world_size}; "
                         f"use a multiple of {world_size} (e.g. {features + world_size - features % world_size})")
    return features // world_size


class ColumnParallelLinear(nn.Module):
    """``nn.Linear(in_features, out_features)`` split by output features over ``world_size`` ranks.

    Args:
        in_features, out_features: the full layer's sizes; ``out_features`` divisible by ``world_size``.
        rank, world_size: this rank's place in ``group`` (default: the whole process group).
        bias: whether the layer has a bias (sharded like the output).
        gather_output: all-gather the output slices into the full output (naive; default False).
        copy_input: start with ``f`` (default). Pass False when the caller applied ``f`` once for
            several layers reading the same input (attention's q, k and v).
        group: the tensor-parallel process group (None: the default group).
    """

    def __init__(self, in_features: int, out_features: int, *, rank: int, world_size: int, bias: bool = True,
                 gather_output: bool = False, copy_input: bool = True, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.rank, self.world_size, self.group = rank, world_size, group
        self.gather_output, self.copy_input = gather_output, copy_input
        local = shard_size(out_features, world_size, "out_features")
        self.weight = nn.Parameter(torch.empty(local, in_features))  # (out/N, in)
        self.bias = nn.Parameter(torch.zeros(local)) if bias else None  # (out/N,)

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world_size: int, **kwargs) -> ColumnParallelLinear:
        """This rank's slice of ``linear``: rows ``rank*out/N .. (rank+1)*out/N`` of its weight and bias."""
        layer = cls(linear.in_features, linear.out_features, rank=rank, world_size=world_size,
                    bias=linear.bias is not None, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(linear.weight.chunk(world_size, dim=0)[rank])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias.chunk(world_size, dim=0)[rank])
        return layer.to(linear.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = copy_to_parallel(x, self.group)  # (..., in), the full input on every rank
        y = F.linear(x, self.weight, self.bias)  # (..., out/N): this rank's output features
        if self.gather_output:
            y = gather_from_parallel(y, -1, self.group)  # (..., out)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(holds {self.weight.shape[0]}), rank={self.rank}/{self.world_size}")


class RowParallelLinear(nn.Module):
    """``nn.Linear(in_features, out_features)`` split by input features over ``world_size`` ranks.

    The input is this rank's slice of the features, ``(..., in/N)`` (a column-parallel layer's
    output); the output is the full ``(..., out)``, the same on every rank.

    Args: as :class:`ColumnParallelLinear`, with ``in_features`` divisible by ``world_size``; the
        bias (``out_features``, replicated) is added after the all-reduce, so it counts once.
    """

    def __init__(self, in_features: int, out_features: int, *, rank: int, world_size: int, bias: bool = True,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.rank, self.world_size, self.group = rank, world_size, group
        local = shard_size(in_features, world_size, "in_features")
        self.weight = nn.Parameter(torch.empty(out_features, local))  # (out, in/N)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None  # (out,) on every rank

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world_size: int, **kwargs) -> RowParallelLinear:
        """This rank's slice of ``linear``: columns ``rank*in/N .. (rank+1)*in/N`` of its weight, all of its bias."""
        layer = cls(linear.in_features, linear.out_features, rank=rank, world_size=world_size,
                    bias=linear.bias is not None, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(linear.weight.chunk(world_size, dim=1)[rank])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer.to(linear.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(-1) != self.weight.size(1):
            raise ValueError(f"RowParallelLinear on rank {self.rank} expects this rank's {self.weight.size(1)} of "
                             f"{self.in_features} input features, got {x.size(-1)}; feed it a column-parallel "
                             "layer's output, or slice the input first")
        partial = F.linear(x, self.weight)  # (..., out): this rank's share of the sum over input features
        y = reduce_from_parallel(partial, self.group)  # (..., out), summed over ranks
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (holds {self.weight.shape[1]}), out_features={self.out_features}, "
                f"rank={self.rank}/{self.world_size}")
