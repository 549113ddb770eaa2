"""What a rank sends per training step under DDP, ZeRO-1 and ZeRO-2, counted from the collectives
the step calls (lab 09), against the ZeRO paper's arithmetic (Rajbhandari et al. 2020, section 7).

:class:`~gpulab.parallel.tp.counting.CollectiveCounter` records each collective with its logical
size B (the full buffer reduced, gathered or broadcast). What a rank puts on the wire follows
from the algorithm (Patarasuk and Yuan 2009, bandwidth-optimal ring): an all-reduce sends
2 (N-1)/N B from every rank, a reduce-scatter or an all-gather (N-1)/N B, and a pipelined
broadcast (N-1)/N B per rank on average (every rank but the last forwards it once). For Ψ
float32 parameters: DDP and ZeRO-2 send 2 (N-1)/N 4Ψ bytes, the lab's ZeRO-1 3 (N-1)/N 4Ψ.

    per_rank = launch(measure_traffic, 2, args=([("DDP", "ddp", None), ("ZeRO-2", "zero2", ZeRO2Optimizer)],))
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.models import MLP
from gpulab.parallel.ddp import allreduce_gradients
from gpulab.parallel.launcher import rank_device
from gpulab.parallel.tp.counting import CollectiveCounter

__all__ = ["SENT_PER_BYTE", "sent_per_rank", "analytic_sent", "measure_traffic"]

SENT_PER_BYTE: dict[str, Callable[[int], float]] = {  # bytes a rank sends per byte of the full buffer, N ranks
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: (n - 1) / n,
}
SCHEMES = {"ddp": 2, "zero1": 3, "zero2": 2}  # (N-1)/N multiples of the model's bytes each scheme sends


def sent_per_rank(counted: dict[str, dict[str, int]], world_size: int) -> float:
    """Bytes a rank sends for the collectives in ``counted`` (``CollectiveCounter.summary()``)."""
    unknown = set(counted) - set(SENT_PER_BYTE)
    if unknown:
        raise ValueError(f"no send cost for {sorted(unknown)}; known: {sorted(SENT_PER_BYTE)}")
    return sum(SENT_PER_BYTE[kind](world_size) * c["bytes"] for kind, c in counted.items())


def analytic_sent(scheme: str, num_params: int, world_size: int, element_size: int = 4) -> float:
    """The paper's figure: 2 (N-1)/N Ψ bytes for DDP and ZeRO-2, 3 (N-1)/N Ψ for the lab's ZeRO-1."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
    return SCHEMES[scheme] * (world_size - 1) / world_size * num_params * element_size


def measure_traffic(rank: int, world_size: int, strategies: Sequence[tuple[str, str, Any]],
                    sizes: Sequence[int] = (64, 256, 256, 10), num_steps: int = 2, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Rank body: train ``MLP(sizes)`` with AdamW ``num_steps`` under each strategy, counting the collectives.

    Args:
        strategies: ``(name, scheme, optimizer wrapper)``: scheme ``"ddp"`` (AdamW, the gradients
            all-reduced: wrapper None), ``"zero1"`` (all-reduce, then ``wrapper(params, AdamW, lr=...)``)
            or ``"zero2"`` (``wrapper(params, AdamW, lr=...)`` alone).

    Returns:
        Per name: ``counted`` (per step ``{kind: {"calls", "bytes"}}``), ``sent`` (bytes this rank
        sends per step), ``analytic`` (:func:`analytic_sent`) and ``num_params``.
    """
    device = rank_device(rank)
    g = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(8 * world_size, sizes[0], generator=g)[rank::world_size].to(device)  # (8, features)
    targets = torch.randint(0, sizes[-1], (8 * world_size,), generator=g)[rank::world_size].to(device)
    out = {}
    for name, scheme, wrapper in strategies:
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r} for {name!r}")
        torch.manual_seed(seed)
        model = MLP(list(sizes)).to(device)
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=1e-3) if scheme == "ddp" else wrapper(params, torch.optim.AdamW, lr=1e-3)
        with CollectiveCounter() as comm:
            for _ in range(num_steps):
                opt.zero_grad()
                nn.functional.cross_entropy(model(inputs), targets).backward()
                if scheme != "zero2":  # ZeRO-2 averages the gradients itself, by reduce-scatter
                    allreduce_gradients(model, world_size)
                opt.step()
        counted = {k: {"calls": v["calls"] / num_steps, "bytes": v["bytes"] / num_steps} for k, v in comm.summary().items()}
        num_params = sum(p.numel() for p in params)
        out[name] = {"counted": counted, "sent": sent_per_rank(counted, world_size), "num_params": num_params,
                     "analytic": analytic_sent(scheme, num_params, world_size)}
    return out
