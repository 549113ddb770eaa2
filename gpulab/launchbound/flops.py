"""FLOPs of a step: counted by PyTorch's ``FlopCounterMode`` and worked out by hand (lab 12).

    python -c "from gpulab.launchbound.flops import *; print(count_flops(TransformerBlock(64, 4, 256), torch.randn(2, 16, 64)))"

``FlopCounterMode`` (``torch.utils.flop_counter``) counts the FLOPs of the matrix products
(``mm``, ``addmm``, ``bmm``, convolutions, attention kernels); elementwise ops count 0, since at
these sizes they are a rounding error next to the products. A multiply-add is 2 FLOPs.

The analytic count of a transformer is the "6·N·tokens" rule (Kaplan et al. 2020, "Scaling Laws
for Neural Language Models", section 2.1): each parameter does one multiply-add per token forward
(2·N) and two backward (4·N). It leaves out attention's own products (``Q Kᵀ`` and ``A V``:
4·B·T²·d per block forward), which grow with the sequence length T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["TransformerBlock", "FlopCount", "count_flops", "transformer_block_flops", "six_n_tokens",
           "matmul_params"]


class TransformerBlock(nn.Module):
    """A pre-norm transformer block with attention written as two matmuls (so every product shows).

    Args:
        d_model: width of the residual stream.
        n_heads: attention heads (``d_model`` must divide evenly).
        d_ff: width of the MLP's hidden layer.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape  # (B, T, d)
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)  # 3 x (B, T, d)
        q, k, v = (t.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, h, T, d/h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.n_heads)  # (B, h, T, T)
        att = scores.softmax(dim=-1) @ v  # (B, h, T, d/h)
        x = x + self.proj(att.transpose(1, 2).reshape(B, T, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


@dataclass
class FlopCount:
    """What ``FlopCounterMode`` counted: the total, and the FLOPs of each aten op."""

    total: int
    by_op: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        ops = ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in sorted(self.by_op.items(), key=lambda kv: -kv[1]))
        return f"{self.total / 1e6:.2f} MFLOP ({ops})"


def count_flops(fn: Callable[..., Any], *args: Any, backward: bool = False, **kwargs: Any) -> FlopCount:
    """Run ``fn(*args, **kwargs)`` under ``FlopCounterMode`` and return what it counted.

    Args:
        fn: a module or a function.
        backward: also run ``.sum().backward()`` on the output, inside the counter.

    Returns:
        A :class:`FlopCount`.
    """
    with FlopCounterMode(display=False) as counter:
        out = fn(*args, **kwargs)
        if backward:
            out.sum().backward()
    by_op = {str(op).split(".")[-1] if "." in str(op) else str(op): int(n)
             for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return FlopCount(int(counter.get_total_flops()), by_op)


def transformer_block_flops(batch_size: int, seq_len: int, d_model: int, n_heads: int, d_ff: int) -> int:
    """Forward FLOPs of :class:`TransformerBlock`'s matrix products (what ``FlopCounterMode`` counts).

    Per token: the QKV projection 2·d·3d, the output projection 2·d·d, the MLP 2·2·d·d_ff; per
    sequence, attention's ``Q Kᵀ`` and ``A V`` are 2·T²·d each. The number of heads changes
    none of it: h heads of width d/h do the same products as one of width d.
    """
    tokens = batch_size * seq_len
    per_token = 2 * d_model * 3 * d_model + 2 * d_model * d_model + 2 * 2 * d_model * d_ff
    return tokens * per_token + batch_size * 2 * (2 * seq_len * seq_len * d_model)


def matmul_params(model: nn.Module) -> int:
    """Parameters that enter a matrix product (the weights of every ``nn.Linear``): the N of 6·N·tokens."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def six_n_tokens(n_params: int, tokens: int) -> int:
    """Training FLOPs of one step by the 6·N·tokens rule (forward 2·N, backward 4·N per token)."""
    return 6 * n_params * tokens
