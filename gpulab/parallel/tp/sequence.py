"""Sequence parallelism: LayerNorm and the MLP block with the sequence split over ranks (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_sequence.py     # 2 and 4 gloo ranks

Plain TP keeps the block's input and output whole on every rank, so the LayerNorm before it
repeats the same work, and keeps the same activations, N times. Korthikanti et al. ("Reducing
Activation Recomputation in Large Transformer Models", 2022) split the sequence instead:

1. each rank holds ``T/N`` tokens, ``(B, T/N, h)``, and normalises them alone;
2. an all-gather of the sequence feeds the column-parallel layer ``(B, T, h)`` (backward: reduce-scatter);
3. GELU and the row-parallel layer run as in plain TP;
4. a reduce-scatter replaces the all-reduce and leaves each rank its ``T/N`` tokens (backward: all-gather).

The same bytes as the two all-reduces, 1/N of LayerNorm's activations. The replicated LayerNorm
sees only its rank's tokens, so :func:`sync_replicated_grads` sums its gradients (as Megatron does).
Self-contained (``F.linear`` on the shards): it needs none of the lab's exercises.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from gpulab.parallel.launcher.startup import rank_device
from gpulab.parallel.tp.counting import CollectiveCounter
from gpulab.parallel.tp.gather import gather_from_sequence, reduce_scatter_to_sequence
from gpulab.parallel.tp.layers import shard_size

__all__ = ["norm_feed_forward", "SequenceParallelMLP", "sync_replicated_grads", "run_sequence_parallel"]


def norm_feed_forward(hidden: int, ffn: int | None = None, seed: int = 0) -> nn.Sequential:
    """``LayerNorm(h) -> Linear(h, ffn) -> GELU -> Linear(ffn, h)`` in one process, weights from ``seed``."""
    torch.manual_seed(seed)
    ffn = ffn or 4 * hidden
    block = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
    with torch.no_grad():  # LayerNorm starts at (1, 0): move it, so its gradients are tested
        block[0].weight.uniform_(0.5, 1.5)
        block[0].bias.uniform_(-0.5, 0.5)
    return block


class SequenceParallelMLP(nn.Module):
    """This rank's share of a :func:`norm_feed_forward` block, input and output split along the sequence.

    Args:
        block: the full block, the same on every rank.
        rank, world_size: this rank's place in ``group``; ``ffn`` and the sequence length divisible by ``world_size``.
        group: the tensor-parallel process group (None: the default group).

    Input ``(B, T/N, h)``, this rank's tokens (``x.chunk(N, dim=1)[rank]``); output the same shape.
    """

    def __init__(self, block: nn.Sequential, rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.group = group
        shard_size(block[1].out_features, world_size, "ffn")
        self.norm = nn.LayerNorm(block[0].normalized_shape).to(block[0].weight.device)
        self.norm.load_state_dict(block[0].state_dict())  # replicated
        with torch.no_grad():
            self.w1 = nn.Parameter(block[1].weight.chunk(world_size, 0)[rank].clone())  # (ffn/N, h)
            self.b1 = nn.Parameter(block[1].bias.chunk(world_size, 0)[rank].clone())  # (ffn/N,)
            self.w2 = nn.Parameter(block[3].weight.chunk(world_size, 1)[rank].clone())  # (h, ffn/N)
            self.b2 = nn.Parameter(block[3].bias.clone())  # (h,), added after the reduce-scatter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)  # (B, T/N, h): 1/N of the tokens
        full = gather_from_sequence(x, 1, self.group)  # (B, T, h)
        hidden = F.gelu(F.linear(full, self.w1, self.b1))  # (B, T, ffn/N)
        partial = F.linear(hidden, self.w2)  # (B, T, h): this rank's share of the sum
        return reduce_scatter_to_sequence(partial, 1, self.group) + self.b2  # (B, T/N, h)


def sync_replicated_grads(module: nn.Module, group: dist.ProcessGroup | None = None) -> int:
    """All-reduce (sum) the gradients of the replicated parameters that saw only this rank's tokens:
    the LayerNorm's, and the bias added after the reduce-scatter. Returns how many were reduced."""
    replicated = [module.norm.weight, module.norm.bias, module.b2]
    for p in replicated:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
    return len(replicated)


def run_sequence_parallel(rank: int, world_size: int, batch_size: int = 3, seq_len: int = 8, hidden: int = 16,
                          seed: int = 0) -> dict[str, Any]:
    """Rank body: one step of :class:`SequenceParallelMLP` on this rank's tokens, against one process.

    Returns:
        ``log`` (the collectives, in order, with their bytes), ``max_abs_diff`` (this rank's output
        and every gradient against the single-process block's matching slices) and
        ``norm_activation_bytes`` (the LayerNorm's output this rank holds: 1/N of the tokens').
    """
    g = torch.Generator().manual_seed(seed)
    x, dy = torch.randn(batch_size, seq_len, hidden, generator=g), torch.randn(batch_size, seq_len, hidden, generator=g)
    full = norm_feed_forward(hidden, seed=seed)
    xf = x.clone().requires_grad_()
    (full(xf) * dy).sum().backward()
    device = rank_device(rank)  # nccl: this rank's GPU
    sp = SequenceParallelMLP(norm_feed_forward(hidden, seed=seed).to(device), rank, world_size)
    mine = x.chunk(world_size, 1)[rank].to(device).requires_grad_()  # (B, T/N, h)
    with CollectiveCounter() as comm:
        y = sp(mine)
        (y * dy.chunk(world_size, 1)[rank].to(device)).sum().backward()
    sync_replicated_grads(sp)
    ref_y = full(x).detach().chunk(world_size, 1)[rank]
    pairs = [(y.cpu(), ref_y), (mine.grad.cpu(), xf.grad.chunk(world_size, 1)[rank]),
             (sp.w1.grad, full[1].weight.grad.chunk(world_size, 0)[rank]),
             (sp.w2.grad, full[3].weight.grad.chunk(world_size, 1)[rank]),
             (sp.norm.weight.grad, full[0].weight.grad), (sp.norm.bias.grad, full[0].bias.grad), (sp.b2.grad, full[3].bias.grad)]
    return {"log": comm.log, "max_abs_diff": max((a.detach().cpu() - b).abs().max().item() for a, b in pairs),
            "norm_activation_bytes": mine.numel() * mine.element_size()}
