"""A tensor-parallel MLP block: column-parallel, GELU, row-parallel (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_mlp.py          # 2 and 4 gloo ranks

The transformer's MLP, ``Linear(h, 4h) -> GELU -> Linear(4h, h)``, split as Megatron-LM does
(Shoeybi et al. 2019, section 3): the first layer by output features, so each rank holds
``4h/N`` of the hidden units and applies GELU to them on its own (GELU is element-wise, so no
communication is needed); the second by input features, so each rank turns its ``4h/N`` units
into a partial sum of the output. Per step:

- forward: one all-reduce of the output ``(tokens, h)`` (``g`` in the row layer);
- backward: one all-reduce of the input's gradient ``(tokens, h)`` (``f`` in the column layer);
- memory: 1/N of both weight matrices and of the hidden activations; the input, the output and
  the second bias stay whole on every rank.

``feed_forward`` builds the single-process block; :class:`TensorParallelMLP` is this rank's share of it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from gpulab.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["feed_forward", "TensorParallelMLP"]


def feed_forward(hidden: int, ffn: int | None = None, seed: int = 0) -> nn.Sequential:
    """``nn.Sequential(Linear(hidden, ffn), GELU(), Linear(ffn, hidden))``, weights drawn from ``seed``
    (``ffn`` defaults to ``4 * hidden``, as in GPT-2)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(hidden, ffn or 4 * hidden), nn.GELU(), nn.Linear(ffn or 4 * hidden, hidden))


class TensorParallelMLP(nn.Module):
    """This rank's share of ``mlp`` (a :func:`feed_forward` block): ``fc1`` column-parallel, ``fc2`` row-parallel.

    Args:
        mlp: the full block, the same on every rank (``mlp[0]``, ``mlp[2]``: the two ``nn.Linear``).
        rank, world_size: this rank's place in ``group``; the hidden size ``ffn`` divisible by ``world_size``.
        group: the tensor-parallel process group (None: the default group).
    """

    def __init__(self, mlp: nn.Sequential, rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear.from_linear(mlp[0], rank, world_size, group=group)  # (ffn/N, h)
        self.fc2 = RowParallelLinear.from_linear(mlp[2], rank, world_size, group=group)  # (h, ffn/N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(self.fc1(x))  # (..., ffn/N): element-wise, so no communication
        return self.fc2(hidden)  # (..., h), the same on every rank
