"""A tensor-parallel block against one process and against DTensor, inside real ranks (lab 11).

    from gpulab.parallel import launch
    from gpulab.parallel.tp import TensorParallelMLP, runs
    per_rank = launch(runs.run_block, 2, args=(TensorParallelMLP, "mlp", [(3, 5)], 0))
    runs.max_abs_diff(per_rank, runs.expected_shards("mlp", [(3, 5)], 0, 2))   # about 1e-7

Every rank builds the same seeded full block (:func:`build`) and the same inputs (:func:`inputs`:
``x`` of shape ``(B, T, h)`` that requires grad, and an upstream gradient ``dy``), takes its share
with ``make(block, rank, world_size)``, and runs one step: ``(block(x) * dy).sum().backward()``.
:func:`run_block` returns what the rank holds (output, the input's gradient, every parameter's
gradient by name, the collectives counted, the weight bytes); :func:`expected_shards` is the same,
computed by one process on the full block and cut into each rank's share; :func:`run_dtensor`
runs DTensor's ``parallelize_module`` instead of ``make``, its gradients named the same way.

Names follow the lab's layout: an MLP's ``fc1`` (column) and ``fc2`` (row); attention's fused
``qkv`` (column, :func:`~gpulab.parallel.tp.attention.fuse_qkv`'s order) and ``out`` (row).
A case is ``(batch_size, seq_len)``; batch sizes need not divide by N (TP splits features, not the batch).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.parallel.launcher.startup import rank_device
from gpulab.parallel.tp.attention import SelfAttention, fuse_qkv
from gpulab.parallel.tp.counting import CollectiveCounter
from gpulab.parallel.tp.dtensor import local_tensor, parallelize
from gpulab.parallel.tp.memory import parameter_bytes
from gpulab.parallel.tp.mlp import feed_forward

__all__ = ["HIDDEN", "FFN", "HEADS", "build", "inputs", "single_process", "expected_shards", "run_block",
           "run_dtensor", "max_abs_diff"]

HIDDEN, FFN, HEADS = 16, 64, 4  # every size divisible by 1, 2 and 4 ranks
Case = tuple[int, int]  # (batch_size, seq_len)


def build(block: str, seed: int = 0, hidden: int = HIDDEN) -> nn.Module:
    """The full single-process block: ``"mlp"`` (``feed_forward(h, 4h)``) or ``"attention"`` (causal, ``HEADS`` heads)."""
    if block == "mlp":
        return feed_forward(hidden, 4 * hidden, seed)
    if block == "attention":
        return SelfAttention(hidden, HEADS, causal=True, seed=seed)
    raise ValueError(f"block={block!r}: use 'mlp' or 'attention'")


def inputs(case: Case, seed: int = 0, hidden: int = HIDDEN) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, dy)``, both ``(B, T, h)`` drawn from ``seed`` and the case; ``x`` requires grad."""
    batch_size, seq_len = case
    g = torch.Generator().manual_seed(seed * 1009 + batch_size * 31 + seq_len)
    x = torch.randn(batch_size, seq_len, hidden, generator=g).requires_grad_()
    return x, torch.randn(batch_size, seq_len, hidden, generator=g)


def single_process(block: str, cases: Sequence[Case], seed: int = 0) -> list[dict[str, Any]]:
    """Per case, one process on the full block: ``output``, ``input_grad`` and ``grads`` (the full block's names)."""
    out = []
    for case in cases:
        full = build(block, seed)
        x, dy = inputs(case, seed)
        y = full(x)  # (B, T, h)
        (y * dy).sum().backward()
        out.append({"output": y.detach(), "input_grad": x.grad,
                    "grads": {n: p.grad.clone() for n, p in full.named_parameters()}})
    return out


def _shard_grads(block: str, full: nn.Module, grads: dict[str, torch.Tensor], rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """The full block's gradients cut into rank ``rank``'s share, under the lab's names."""
    if block == "mlp":
        return {"fc1.weight": grads["0.weight"].chunk(world_size, 0)[rank],
                "fc1.bias": grads["0.bias"].chunk(world_size, 0)[rank],
                "fc2.weight": grads["2.weight"].chunk(world_size, 1)[rank],
                "fc2.bias": grads["2.bias"]}
    qkv = {part: fuse_qkv(full, world_size, tuple(grads[f"{n}.{part}"] for n in "qkv")).chunk(world_size)[rank]
           for part in ("weight", "bias")}
    return {"qkv.weight": qkv["weight"], "qkv.bias": qkv["bias"],
            "out.weight": grads["out.weight"].chunk(world_size, 1)[rank], "out.bias": grads["out.bias"]}


def expected_shards(block: str, cases: Sequence[Case], seed: int, world_size: int) -> list[list[dict[str, Any]]]:
    """What each rank of a correct tensor-parallel block holds after :func:`run_block`: per rank, per case,
    ``output`` and ``input_grad`` (whole: the same on every rank) and ``grads`` (this rank's share)."""
    full = build(block, seed)
    ref = single_process(block, cases, seed)
    return [[{"output": r["output"], "input_grad": r["input_grad"],
              "grads": _shard_grads(block, full, r["grads"], rank, world_size)} for r in ref]
            for rank in range(world_size)]


def _step(tp: nn.Module, case: Case, seed: int) -> dict[str, Any]:
    device = next(tp.parameters()).device
    x, dy = (t.detach().to(device) for t in inputs(case, seed))
    x.requires_grad_()
    with CollectiveCounter() as comm:
        y = tp(x)
        (y * dy).sum().backward()
    return {"output": y.detach(), "input_grad": x.grad, "comm": comm.summary()}


def run_block(rank: int, world_size: int, make: Callable[[nn.Module, int, int], nn.Module], block: str,
              cases: Sequence[Case], seed: int = 0) -> list[dict[str, Any]]:
    """Rank body: ``make(full_block, rank, world_size)``, one step per case.

    Returns:
        Per case: ``output``, ``input_grad``, ``grads`` (by parameter name), ``comm`` (the
        :class:`CollectiveCounter` summary of the step), ``weight_bytes`` (2-D parameters only),
        ``param_bytes``, and ``dtensor_params`` (whether any parameter is a DTensor).
    """
    results = []
    for case in cases:
        tp = make(build(block, seed).to(rank_device(rank)), rank, world_size)  # nccl: this rank's GPU
        res = _step(tp, case, seed)
        res["grads"] = {n: p.grad.detach().clone() if p.grad is not None else None for n, p in tp.named_parameters()}
        res["weight_bytes"] = parameter_bytes(tp, matrices_only=True)
        res["param_bytes"] = parameter_bytes(tp)
        res["dtensor_params"] = any(hasattr(p, "to_local") for p in tp.parameters())
        results.append(res)
    return results


def run_dtensor(rank: int, world_size: int, block: str, cases: Sequence[Case], seed: int = 0) -> list[dict[str, Any]]:
    """Rank body: DTensor's ``parallelize_module`` on the same block, the same steps as :func:`run_block`
    (``grads`` under the lab's names, local shards)."""
    results = []
    device = rank_device(rank)
    for case in cases:
        tp = parallelize(build(block, seed).to(device), world_size, device.type)
        res = _step(tp, case, seed)
        g = {n: local_tensor(p.grad).detach().clone() for n, p in tp.named_parameters()}
        if block == "mlp":
            res["grads"] = {"fc1.weight": g["0.weight"], "fc1.bias": g["0.bias"], "fc2.weight": g["2.weight"],
                            "fc2.bias": g["2.bias"]}
        else:  # a rank's local q, k, v are its heads: stacked, they are its rows of the fused qkv
            res["grads"] = {"qkv.weight": torch.cat([g[f"{n}.weight"] for n in "qkv"]),
                            "qkv.bias": torch.cat([g[f"{n}.bias"] for n in "qkv"]),
                            "out.weight": g["out.weight"], "out.bias": g["out.bias"]}
        res["weight_bytes"] = sum(local_tensor(p).numel() * p.element_size() for p in tp.parameters() if p.dim() >= 2)
        results.append(res)
    return results


def max_abs_diff(per_rank: Sequence[Sequence[dict[str, Any]]], expected: Sequence[Sequence[dict[str, Any]]]) -> float:
    """The largest absolute difference between the outputs, input gradients and parameter gradients of two runs.

    Raises:
        KeyError: when a gradient named in ``expected`` is missing from ``per_rank``.
    """
    worst = 0.0
    for got_rank, exp_rank in zip(per_rank, expected, strict=True):
        for got, exp in zip(got_rank, exp_rank, strict=True):
            pairs = [(got["output"], exp["output"]), (got["input_grad"], exp["input_grad"])]
            pairs += [(got["grads"][n], e) for n, e in exp["grads"].items()]
            worst = max(worst, *((a - b).abs().max().item() for a, b in pairs))
    return worst
