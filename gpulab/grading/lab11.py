"""Lab 11's graders: a student's conjugate operators, parallel linears, tensor-parallel MLP and
attention, each run inside real ranks (started by :func:`gpulab.parallel.launch` with fork, so the
classes may come from notebook cells).

Each ``run_*`` function returns what the ranks hold; the test cell checks it against the function
next to it, called only inside ``grading.by_reference`` (gpulab's references are masked in the
student's kernel while the lab is graded):

- :func:`run_conjugates` (``f`` and ``g`` as ``torch.autograd.Function`` classes) against
  :func:`expected_conjugates`: the sums over ranks, computed in one process;
- :func:`run_linear` (column- and row-parallel layers built from a full ``nn.Linear``) against
  :func:`expected_linear`: the full layer's output and gradients, cut into each rank's share;
- :func:`run_block` (an MLP block or attention split over ranks) against :func:`expected_block`
  (one process), :func:`analytic_comm` (the all-reduces counted per step),
  :func:`weight_bytes_per_rank` (1/N of the full block) and :func:`dtensor_block` (PyTorch's
  ``parallelize_module`` on the same weights).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.parallel import launch, rank_device
from gpulab.parallel.tp import runs
from gpulab.parallel.tp.attention import TensorParallelAttention
from gpulab.parallel.tp.conjugate import CopyToParallel, ReduceFromParallel, copy_to_parallel, reduce_from_parallel
from gpulab.parallel.tp.counting import CollectiveCounter, analytic_allreduces
from gpulab.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear
from gpulab.parallel.tp.memory import parameter_bytes
from gpulab.parallel.tp.mlp import TensorParallelMLP

__all__ = ["REFERENCES", "TOLERANCE", "conjugate_case", "run_conjugates", "expected_conjugates", "linear_case",
           "run_linear", "expected_linear", "block_cases", "run_block", "expected_block", "analytic_comm",
           "weight_bytes_per_rank", "dtensor_block"]

# gpulab's reference implementations of lab 11's exercises, masked in a graded kernel (gpulab.autograde.box.mask).
# The lab's demos that need a tensor-parallel block take the student's (yours_or_reference); the DTensor,
# sequence-parallel, 2-D and timing demos use none of these.
REFERENCES: tuple = (CopyToParallel, ReduceFromParallel, copy_to_parallel, reduce_from_parallel,
                     ColumnParallelLinear, RowParallelLinear, TensorParallelMLP, TensorParallelAttention)

TOLERANCE = 1e-5  # float32, sums over ranks in another order than one process's

Case = tuple[int, int]


def _case_tensor(rank: int, salt: int, shape: Sequence[int], seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed * 7919 + 100 * salt + rank))


# --- exercise 1: f and g -----------------------------------------------------------------------------------

def conjugate_case(rng: random.Random) -> tuple[tuple[int, int], int]:
    """``(shape, seed)`` for :func:`run_conjugates`, drawn from ``rng``."""
    return (rng.randint(1, 6), rng.randint(1, 9)), rng.randrange(10**6)


def _conjugates_rank(rank: int, world_size: int, copy_cls: type, reduce_cls: type, shape: tuple[int, int],
                     seed: int) -> dict[str, Any]:
    out, device = {}, rank_device(rank)  # nccl: this rank's GPU
    for name, cls in (("f", copy_cls), ("g", reduce_cls)):
        x = _case_tensor(rank, 1, shape, seed).to(device).requires_grad_()  # a different tensor on every rank
        with CollectiveCounter() as forward:
            y = cls.apply(x)
        with CollectiveCounter() as backward:
            (y * _case_tensor(rank, 2, shape, seed).to(device)).sum().backward()  # a different upstream gradient too
        out[name] = {"output": y.detach(), "input_grad": x.grad, "input_after": x.detach(),
                     "forward_comm": forward.summary(), "backward_comm": backward.summary()}
    return out


def run_conjugates(copy_cls: type, reduce_cls: type, world_size: int, shape: tuple[int, int] = (3, 5),
                   seed: int = 0, timeout: float = 90) -> list[dict[str, Any]]:
    """Apply ``copy_cls`` (f) and ``reduce_cls`` (g) on ``world_size`` ranks, each to its own tensor.

    Returns:
        Per rank, for ``"f"`` and ``"g"``: ``output``, ``input_grad`` (of ``sum(output * upstream)``,
        the upstream gradient different on every rank), ``input_after`` (the input after the call:
        unchanged if nothing wrote into it), and the collectives of the forward and of the backward.
    """
    return launch(_conjugates_rank, world_size, args=(copy_cls, reduce_cls, tuple(shape), seed), timeout=timeout,
                  echo=False)


def expected_conjugates(world_size: int, shape: tuple[int, int] = (3, 5), seed: int = 0) -> list[dict[str, Any]]:
    """What :func:`run_conjugates` returns for a right f and g, computed in one process."""
    xs = [_case_tensor(r, 1, shape, seed) for r in range(world_size)]
    dys = [_case_tensor(r, 2, shape, seed) for r in range(world_size)]
    reduce = {"all_reduce": {"calls": 1, "bytes": xs[0].numel() * xs[0].element_size()}}
    return [{"f": {"output": xs[r], "input_grad": sum(dys), "input_after": xs[r], "forward_comm": {},
                   "backward_comm": reduce},
             "g": {"output": sum(xs), "input_grad": dys[r], "input_after": xs[r], "forward_comm": reduce,
                   "backward_comm": {}}} for r in range(world_size)]


# --- exercise 2: column- and row-parallel linears -----------------------------------------------------------

def linear_case(rng: random.Random) -> dict[str, Any]:
    """Keyword arguments for :func:`run_linear`: sizes divisible by 4, odd batch sizes, a seed."""
    return {"in_features": 4 * rng.randint(1, 5), "out_features": 4 * rng.randint(1, 5),
            "batch_sizes": tuple(rng.choice([1, 3, 5, 7, 9]) for _ in range(2)), "seed": rng.randrange(10**6)}


def _full_linear(in_features: int, out_features: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features)


def _linear_rank(rank, world_size, column_cls, row_cls, in_features, out_features, batch_sizes, seed):
    out, device = {}, rank_device(rank)  # nccl: this rank's GPU
    for b in batch_sizes:
        x = _case_tensor(0, b, (b, in_features), seed).to(device)
        dy = _case_tensor(0, b + 1, (b, out_features), seed).to(device)
        column = column_cls(_full_linear(in_features, out_features, seed).to(device), rank, world_size)
        xc = x.clone().requires_grad_()
        y = column(xc)  # (B, out/N)
        (y * dy.chunk(world_size, -1)[rank]).sum().backward()
        row = row_cls(_full_linear(in_features, out_features, seed).to(device), rank, world_size)
        xr = x.chunk(world_size, -1)[rank].clone().requires_grad_()  # (B, in/N): this rank's input features
        z = row(xr)  # (B, out)
        (z * dy).sum().backward()
        out[f"batch {b}"] = {
            "column": {"output": y.detach(), "input_grad": xc.grad, "weight_grad": column.weight.grad,
                       "bias_grad": column.bias.grad, "weight_bytes": parameter_bytes(column, matrices_only=True)},
            "row": {"output": z.detach(), "input_grad": xr.grad, "weight_grad": row.weight.grad,
                    "bias_grad": row.bias.grad, "weight_bytes": parameter_bytes(row, matrices_only=True)}}
    return out


def run_linear(column_cls: Callable, row_cls: Callable, world_size: int, *, in_features: int = 12, out_features: int = 8,
               batch_sizes: Sequence[int] = (3, 5), seed: int = 0, timeout: float = 90) -> list[dict[str, Any]]:
    """Build ``column_cls(linear, rank, world_size)`` and ``row_cls(linear, rank, world_size)`` from the
    same seeded ``nn.Linear(in_features, out_features)`` on every rank and run one step per batch size.

    The column layer gets the full input; the row layer this rank's slice of the input features.

    Returns:
        Per rank, per ``"batch B"``, for ``"column"`` and ``"row"``: ``output``, ``input_grad``,
        ``weight_grad``, ``bias_grad`` and ``weight_bytes`` (the 2-D parameters the layer holds).
    """
    return launch(_linear_rank, world_size, args=(column_cls, row_cls, in_features, out_features, tuple(batch_sizes), seed),
                  timeout=timeout, echo=False)


def expected_linear(world_size: int, *, in_features: int = 12, out_features: int = 8, batch_sizes: Sequence[int] = (3, 5),
                    seed: int = 0) -> list[dict[str, Any]]:
    """What :func:`run_linear` returns for right layers: the full layer's values, cut per rank."""
    per_rank: list[dict[str, Any]] = [{} for _ in range(world_size)]
    for b in batch_sizes:
        x, dy = _case_tensor(0, b, (b, in_features), seed), _case_tensor(0, b + 1, (b, out_features), seed)
        full = _full_linear(in_features, out_features, seed)
        x.requires_grad_()
        y = full(x)
        (y * dy).sum().backward()
        w_bytes = in_features * out_features * 4 // world_size
        for r in range(world_size):
            per_rank[r][f"batch {b}"] = {
                "column": {"output": y.detach().chunk(world_size, -1)[r], "input_grad": x.grad,
                           "weight_grad": full.weight.grad.chunk(world_size, 0)[r],
                           "bias_grad": full.bias.grad.chunk(world_size, 0)[r], "weight_bytes": w_bytes},
                "row": {"output": y.detach(), "input_grad": x.grad.chunk(world_size, -1)[r],
                        "weight_grad": full.weight.grad.chunk(world_size, 1)[r], "bias_grad": full.bias.grad,
                        "weight_bytes": w_bytes}}
    return per_rank


# --- exercises 3 and 4: the MLP block and attention -----------------------------------------------------------

def block_cases(rng: random.Random, n: int = 3) -> tuple[tuple[Case, ...], int]:
    """``(cases, seed)``: ``n`` cases of (odd batch size, sequence length) and a seed, drawn from ``rng``."""
    return tuple((rng.choice([1, 3, 5, 7]), rng.randint(1, 6)) for _ in range(n)), rng.randrange(10**6)


def _values(per_rank: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    return [[{k: case[k] for k in ("output", "input_grad", "grads")} for case in rank] for rank in per_rank]


def run_block(cls: Callable, block: str, world_size: int, cases: Sequence[Case] = ((3, 4), (5, 2)), seed: int = 0,
              timeout: float = 90) -> dict[str, Any]:
    """One step per case of ``cls(full_block, rank, world_size)`` on ``world_size`` ranks.

    ``block`` is ``"mlp"`` (``feed_forward(16, 64)``; the parts are named ``fc1``, ``fc2``) or
    ``"attention"`` (``SelfAttention(16, 4 heads, causal)``; ``qkv``, ``out``).

    Returns:
        ``values`` (per rank, per case: ``output``, ``input_grad``, ``grads`` by parameter name),
        ``comm`` (per rank, per case: the collectives counted), ``weight_bytes`` (per rank: the 2-D
        parameters held) and ``dtensor_params`` (whether any rank's parameters are DTensors).
    """
    per_rank = launch(runs.run_block, world_size, args=(cls, block, tuple(cases), seed), timeout=timeout, echo=False)
    return {"values": _values(per_rank), "comm": [[case["comm"] for case in rank] for rank in per_rank],
            "weight_bytes": [rank[0]["weight_bytes"] for rank in per_rank],
            "dtensor_params": any(case["dtensor_params"] for rank in per_rank for case in rank)}


def expected_block(block: str, world_size: int, cases: Sequence[Case] = ((3, 4), (5, 2)), seed: int = 0) -> list:
    """``values`` of :func:`run_block` for a right block: one process on the full block, cut per rank."""
    return runs.expected_shards(block, tuple(cases), seed, world_size)


def analytic_comm(block: str, world_size: int, cases: Sequence[Case] = ((3, 4), (5, 2))) -> list:
    """``comm`` of :func:`run_block` for Megatron's block: one all-reduce forward, one backward."""
    return [[{"all_reduce": analytic_allreduces(b * t, runs.HIDDEN, block)} for b, t in cases]
            for _ in range(world_size)]


def weight_bytes_per_rank(block: str, world_size: int) -> list[int]:
    """``weight_bytes`` of :func:`run_block` for a right block: 1/N of the full block's weight matrices."""
    return [parameter_bytes(runs.build(block), matrices_only=True) // world_size] * world_size


def dtensor_block(block: str, world_size: int, cases: Sequence[Case] = ((3, 4), (5, 2)), seed: int = 0) -> list:
    """``values`` of DTensor's ``parallelize_module`` on the same block and steps (ColwiseParallel / RowwiseParallel)."""
    return _values(launch(runs.run_dtensor, world_size, args=(block, tuple(cases), seed), timeout=120, echo=False))
