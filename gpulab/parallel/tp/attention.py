"""Multi-head self-attention split by heads over ranks (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_attention.py    # 2 and 4 gloo ranks

Heads are independent until the output projection, so N ranks each take ``heads/N`` of them
(Megatron-LM, Shoeybi et al. 2019, section 3): q, k and v are column-parallel (each rank keeps
the rows of its heads), attention runs on the local heads with no communication, and the
output projection is row-parallel (its input features are the concatenated heads). As in the
MLP, one all-reduce forward (``g``) and one backward (``f``, applied once for q, k and v).

:class:`SelfAttention` is the single-process block (separate ``q``/``k``/``v``/``out`` linears,
the layout DTensor's ``parallelize_module`` plans name); :func:`fuse_qkv` stacks q, k and v
into one ``Linear(E, 3E)`` whose contiguous N-way split gives each rank ``[q; k; v]`` of its heads,
so one column-parallel layer (one ``f``) serves all three. :class:`TensorParallelAttention` is
this rank's share.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from gpulab.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear, shard_size

__all__ = ["SelfAttention", "fuse_qkv", "TensorParallelAttention"]


class SelfAttention(nn.Module):
    """Multi-head self-attention, ``(B, T, E) -> (B, T, E)``, weights drawn from ``seed``.

    ``forward`` reshapes with ``-1`` heads, so the same code runs on a rank that holds only some
    heads (DTensor's ``ColwiseParallel`` leaves local q/k/v of ``E/N`` features).
    """

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False, seed: int = 0) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, shard_size(embed_dim, num_heads, "embed_dim (per head)")
        self.causal = causal
        torch.manual_seed(seed)
        self.q, self.k, self.v, self.out = (nn.Linear(embed_dim, embed_dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))  # (B, nh, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # (B, nh, T, hd)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, nh*hd) -> (B, T, E)


def fuse_qkv(attn: SelfAttention, world_size: int, tensors: tuple[torch.Tensor, ...] | None = None) -> nn.Linear | torch.Tensor:
    """q, k and v of ``attn`` as one ``nn.Linear(E, 3E)`` whose rows are ``[q_0; k_0; v_0; q_1; k_1; v_1; ...]``
    (``q_r``: the rows of rank r's heads), so ``weight.chunk(world_size)[r]`` is rank r's q, k and v.

    With ``tensors=(tq, tk, tv)`` (three tensors shaped like the weights or the biases, e.g. their
    gradients) it returns them stacked in the same order instead.
    """
    shard_size(attn.num_heads, world_size, "num_heads")
    def stack(tq: torch.Tensor, tk: torch.Tensor, tv: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.cat(parts) for parts in zip(tq.chunk(world_size), tk.chunk(world_size), tv.chunk(world_size))])
    if tensors is not None:
        return stack(*tensors)
    embed = attn.q.in_features
    fused = nn.Linear(embed, 3 * embed).to(attn.q.weight.device)
    with torch.no_grad():
        fused.weight.copy_(stack(attn.q.weight, attn.k.weight, attn.v.weight))  # (3E, E)
        fused.bias.copy_(stack(attn.q.bias, attn.k.bias, attn.v.bias))  # (3E,)
    return fused


class TensorParallelAttention(nn.Module):
    """This rank's ``heads/N`` heads of ``attn``: ``qkv`` column-parallel (fused), ``out`` row-parallel.

    Args:
        attn: the full :class:`SelfAttention`, the same on every rank; ``num_heads`` divisible by ``world_size``.
        rank, world_size, group: as :class:`~gpulab.parallel.tp.layers.ColumnParallelLinear`.
    """

    def __init__(self, attn: SelfAttention, rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.head_dim, self.causal = attn.head_dim, attn.causal
        self.qkv = ColumnParallelLinear.from_linear(fuse_qkv(attn, world_size), rank, world_size, group=group)  # (3E/N, E)
        self.out = RowParallelLinear.from_linear(attn.out, rank, world_size, group=group)  # (E, E/N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, E/N): this rank's heads
        q, k, v = (t.reshape(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh/N, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # (B, nh/N, T, hd)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, E/N) -> (B, T, E), summed over ranks
