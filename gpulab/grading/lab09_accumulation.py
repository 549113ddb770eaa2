"""Lab 09's graders for the gradient-accumulation exercise: named accumulation steps
``fn(model, optimizer, micro_batches, loss_fn)`` run inside real ranks on lab 06's
:class:`NaiveDDP` or :class:`BucketedDDP`.

Code inside ranks cannot send evidence: :func:`run_accumulation` returns the all-reduce calls per
step (counted), the step times and every rank's parameters, for the test cell's checks to send; the
source's own ``accumulate_step``, run the same way in the reference run, gives the expected side.
:func:`calls_per_sync` and :func:`single_process_accumulation` give a visible test's interactive
expected values (one synchronisation's calls; one process stepping on the whole batch).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.grading.lab09 import NUM_SAMPLES, _data
from gpulab.models import MLP
from gpulab.parallel import BucketedDDP, NaiveDDP, bucket_assignment, launch, rank_device
from gpulab.parallel.sharding.accumulation import count_collectives
from gpulab.profiling.interleave import timed_call

__all__ = ["every_micro_batch", "run_accumulation", "calls_per_sync", "single_process_accumulation"]


def every_micro_batch(
    model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: Sequence[Any], loss_fn: Callable
) -> None:
    """The baseline: synchronise after every micro-batch (correct, k times the calls)."""
    for inputs, targets in micro_batches:
        (loss_fn(model(inputs), targets) / len(micro_batches)).backward()
        model.sync_gradients()
    optimizer.step()
    optimizer.zero_grad()


def _wrapped(wrapper: str, module: nn.Module) -> nn.Module:
    if wrapper == "naive":
        return NaiveDDP(module)
    return BucketedDDP(module, bucket_size_mb=_bucket_mb(module))


def _bucket_mb(module: nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in module.parameters()) / 3 / 2**20  # about 3 buckets


def _accumulation_rank(rank, world_size, step_fns, wrapper, micro_batches, num_steps, warmup, sizes, num_samples, seed):
    device = rank_device(rank)
    inputs, targets = (
        t.chunk(world_size)[rank].to(device) for t in _data(sizes[0], sizes[-1], seed=seed, num_samples=num_samples)
    )
    micro = list(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))  # k micro-batches
    runs = []
    for name, fn in step_fns:
        torch.manual_seed(0)
        module = MLP(sizes).to(device)
        model = _wrapped(wrapper, module)
        per_sync = len(model.buckets) if wrapper == "bucketed" else len(list(module.parameters()))
        opt = torch.optim.SGD(module.parameters(), lr=0.2, momentum=0.9)
        runs.append({"name": name, "fn": fn, "model": model, "opt": opt, "per_sync": per_sync, "calls": 0, "times": []})
    for step in range(warmup + num_steps):
        for run in runs:  # interleaved, so machine load hits every variant alike
            torch.distributed.barrier()
            with count_collectives() as calls:  # timed_call: on a GPU the step's kernels, not only their launch
                wall, _ = timed_call(
                    lambda run=run: run["fn"](run["model"], run["opt"], micro, nn.functional.cross_entropy)
                )
            if step >= warmup:  # the first steps set up gloo's buffers: neither timed nor counted
                run["times"].append(wall)
                run["calls"] += calls["all_reduce"]
    return {
        run["name"]: {
            "all_reduce_per_step": run["calls"] / num_steps,
            "per_sync": run["per_sync"],
            "step_s": run["times"],
            "params": {n: p.detach().cpu() for n, p in run["model"].module.named_parameters()},
        }
        for run in runs
    }


def run_accumulation(
    step_fns: Sequence[tuple[str, Callable]],
    world_size: int = 2,
    *,
    wrapper: str = "naive",
    micro_batches: int = 3,
    num_steps: int = 2,
    warmup: int = 0,
    sizes: Sequence[int] = (8, 32, 32, 8),
    num_samples: int = NUM_SAMPLES,
    seed: int = 1,
    timeout: float = 90,
) -> dict[str, dict[str, Any]]:
    """Run each named accumulation step ``num_steps`` times on ``world_size`` ranks (one launch).

    Each rank splits its half (third...) of a ``num_samples`` batch drawn from ``seed`` into
    ``micro_batches``; the variants take their steps interleaved. ``warmup`` steps come first,
    neither timed nor counted.

    Returns:
        Per name: ``all_reduce_per_step`` (calls, counted), ``per_sync`` (calls one full
        synchronisation makes), ``step_s`` (the slower rank's seconds per step), ``params`` (every
        rank's, after training: compare with :func:`single_process_accumulation`), and for the
        demos ``max_abs_diff`` (worst rank vs one process stepping on the whole batch) and
        ``rank_spread`` (the largest difference between two ranks' parameters).
    """
    if wrapper not in ("naive", "bucketed"):
        raise ValueError(f"wrapper must be 'naive' or 'bucketed', got {wrapper!r}")
    if num_samples % (world_size * micro_batches):
        raise ValueError(
            f"num_samples={num_samples} must be divisible by world_size x micro_batches = "
            f"{world_size * micro_batches}, so every micro-batch has the same size"
        )
    per_rank = launch(
        _accumulation_rank,
        world_size,
        args=(list(step_fns), wrapper, micro_batches, num_steps, warmup, tuple(sizes), num_samples, seed),
        timeout=timeout,
        echo=False,
    )
    ref = single_process_accumulation(1, num_steps, warmup, sizes, num_samples, seed)[0]
    out = {}
    for name, _ in step_fns:
        runs = [r[name] for r in per_rank]
        out[name] = {
            "all_reduce_per_step": runs[0]["all_reduce_per_step"],
            "per_sync": runs[0]["per_sync"],
            "step_s": [max(ts) for ts in zip(*(r["step_s"] for r in runs))],
            "params": [r["params"] for r in runs],
            "max_abs_diff": max((r["params"][n] - p).abs().max().item() for r in runs for n, p in ref.items()),
            "rank_spread": max(
                (r["params"][n] - runs[0]["params"][n]).abs().max().item() for r in runs for n in runs[0]["params"]
            ),
        }
    return out


def calls_per_sync(wrapper: str, sizes: Sequence[int] = (8, 32, 32, 8)) -> int:
    """All-reduce calls one synchronisation of ``wrapper`` makes on ``MLP(sizes)``: one per
    parameter (NaiveDDP), one per bucket of gpulab's plan (BucketedDDP, about 3 buckets)."""
    module = MLP(sizes)
    if wrapper == "naive":
        return len(list(module.parameters()))
    return len(bucket_assignment(list(module.parameters()), _bucket_mb(module)))


def single_process_accumulation(
    world_size: int = 2,
    num_steps: int = 2,
    warmup: int = 0,
    sizes: Sequence[int] = (8, 32, 32, 8),
    num_samples: int = NUM_SAMPLES,
    seed: int = 1,
) -> list[dict[str, torch.Tensor]]:
    """Every rank's parameters after :func:`run_accumulation`, as one process stepping on the whole
    batch computes them (``[params] * world_size``)."""
    torch.manual_seed(0)
    ref = MLP(sizes)
    opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    inputs, targets = _data(sizes[0], sizes[-1], seed=seed, num_samples=num_samples)
    for _ in range(warmup + num_steps):
        nn.functional.cross_entropy(ref(inputs), targets).backward()
        opt.step()
        opt.zero_grad()
    params = {n: p.detach().clone() for n, p in ref.named_parameters()}
    return [params] * world_size
