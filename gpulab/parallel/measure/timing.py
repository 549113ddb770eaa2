"""Per-step time of several gradient-synchronisation strategies, measured side by side (lab 06).

One launch, several strategies: every rank builds one replica per strategy (same initial
weights), then runs their steps *interleaved* by gpulab's one timer
(:func:`gpulab.profiling.interleave.time_interleaved`: naive, bucketed, torch DDP, then bucketed,
torch DDP, naive, ...), so a busy machine slows them all alike and their ratio stays meaningful.
Each timed step starts after a barrier, so it measures the step, not how late the other rank arrived.

    results = launch(time_sync_strategies, 2, args=(["naive", "overlapped", "bucketed", "torch_ddp"], StepTimingConfig()))
    summarize_step_times(results)        # {"naive": 0.21, "bucketed": 0.05, ...} seconds per step

A strategy is a name (``naive``, ``overlapped``, ``bucketed``, ``torch_ddp``, ``local``) or a tuple:
``(name, sync_fn)`` calls ``sync_fn(model, world_size)`` after backward; ``(name, "wrap", wrap_fn)``
trains ``wrap_fn(model)`` (a wrapper with ``finish()``, called after backward: a student's DDP
class); ``(name, "bucketed", assign_fn)`` is BucketedDDP with that bucket plan.

The model is an MLP of many small layers: each layer's weight is one gradient tensor, so it shows
the fixed cost per all-reduce call that buckets remove. ``benchmarks/ddp.py`` prints the figures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gpulab.models import MLP
from gpulab.parallel.ddp.allreduce import NaiveDDP, OverlappedDDP
from gpulab.parallel.ddp.bucketed import BucketedDDP
from gpulab.parallel.launcher.startup import rank_device
from gpulab.profiling.interleave import time_interleaved

__all__ = ["StepTimingConfig", "deep_mlp", "time_sync_strategies", "summarize_step_times"]


@dataclass
class StepTimingConfig:
    """What :func:`time_sync_strategies` trains and how long it measures.

    Attributes:
        width: features per hidden layer.
        depth: hidden layers (each adds a weight and a bias gradient: 2 all-reduces for the naive way).
        batch_size: the *global* batch; each rank gets ``batch_size // world_size``.
        num_steps: timed steps per strategy.
        warmup: untimed steps per strategy first (allocator, gloo buffers, lazy init).
        bucket_size_mb: bucket capacity for BucketedDDP and torch DDP's ``bucket_cap_mb``.
        seed: initial weights and data.
    """

    width: int = 256
    depth: int = 24
    batch_size: int = 64
    num_steps: int = 8
    warmup: int = 2
    bucket_size_mb: float = 1.0
    seed: int = 0


def deep_mlp(width: int, depth: int, num_classes: int = 10, seed: int = 0) -> MLP:
    """``depth`` Linear+ReLU layers of ``width`` features and a classifier, seeded (same on every rank)."""
    torch.manual_seed(seed)
    return MLP([width] * (depth + 1) + [num_classes])


def _wrap(spec: Any, model: nn.Module, cfg: StepTimingConfig, world_size: int, device: torch.device):
    """(name, wrapped model, what to call after backward) for one strategy spec."""
    if isinstance(spec, tuple) and len(spec) == 2:  # (name, sync_fn): your all-reduce after backward
        name, fn = spec
        return name, model, lambda: fn(model, world_size)
    if isinstance(spec, tuple) and len(spec) == 3 and spec[1] == "bucketed":  # (name, "bucketed", assign_fn)
        m = BucketedDDP(model, bucket_size_mb=cfg.bucket_size_mb, assign_buckets=spec[2])
        return spec[0], m, m.finish
    if isinstance(spec, tuple) and len(spec) == 3 and spec[1] == "wrap":  # (name, "wrap", wrap_fn): has finish()
        m = spec[2](model)
        return spec[0], m, m.finish
    if spec in ("naive", "overlapped", "bucketed"):
        m = {"naive": NaiveDDP, "overlapped": OverlappedDDP}[spec](model) if spec != "bucketed" \
            else BucketedDDP(model, bucket_size_mb=cfg.bucket_size_mb)
        return spec, m, m.finish
    if spec == "torch_ddp":
        ids = [device.index] if device.type == "cuda" else None  # CPU modules take no device_ids
        return spec, nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cfg.bucket_size_mb), lambda: None
    if spec == "local":  # no synchronisation at all: the compute-only floor
        return spec, model, lambda: None
    raise ValueError(f"unknown strategy {spec!r}; use 'naive', 'overlapped', 'bucketed', 'torch_ddp', 'local', "
                     "(name, sync_fn), (name, 'wrap', wrap_fn) or (name, 'bucketed', assign_buckets_fn)")


def time_sync_strategies(rank: int, world_size: int, strategies: Sequence[str | tuple],
                         cfg: StepTimingConfig | None = None, *, cpu: bool = False) -> dict[str, list[float]]:
    """Rank body: seconds per training step for each strategy (run it with ``launch``).

    Args:
        rank, world_size: as passed by :func:`gpulab.parallel.launcher.launch`.
        strategies: see the module docstring.
        cfg: sizes and step counts.
        cpu: also return this rank's CPU seconds per step, under ``"cpu:" + name``.

    Returns:
        ``{name: [seconds per timed step]}`` measured on this rank (and ``{"cpu:" + name: [...]}``).
    """
    cfg = cfg or StepTimingConfig()
    device = rank_device(rank)
    g = torch.Generator().manual_seed(cfg.seed + 1 + rank)  # each rank its own slice of data
    local = cfg.batch_size // world_size
    inputs = torch.randn(local, cfg.width, generator=g).to(device)
    targets = torch.randint(0, 10, (local,), generator=g).to(device)
    runs = {}
    for spec in strategies:
        name, model, sync = _wrap(spec, deep_mlp(cfg.width, cfg.depth, seed=cfg.seed).to(device), cfg, world_size, device)
        runs[name] = (model, sync, torch.optim.SGD(model.parameters(), lr=0.01))

    def before_each() -> None:  # untimed: the ranks start each step together, GPUs idle
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Every rank runs the same rounds in the same (rotating) order, so their collectives match.
    timings = time_interleaved({name: _step(*run, inputs, targets, device) for name, run in runs.items()},
                               repeats=cfg.num_steps, warmup=cfg.warmup, before_each=before_each)
    return {**timings.wall, **({f"cpu:{n}": t for n, t in timings.cpu.items()} if cpu else {})}


def _step(model: nn.Module, sync: Callable[[], Any], opt: torch.optim.Optimizer, inputs: torch.Tensor,
          targets: torch.Tensor, device: torch.device) -> Callable[[], None]:
    """One timed training step of a strategy: forward, backward, gradient sync, optimizer step."""
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        sync()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # GPU work is asynchronous: wait before reading the clock

    return step


def summarize_step_times(per_rank: Sequence[dict[str, list[float]]]) -> dict[str, float]:
    """Median over steps of the slowest rank's step time (a step ends when the last rank ends)."""
    names = [n for n in per_rank[0] if not n.startswith("cpu:")]
    return {n: statistics.median(max(r[n][i] for r in per_rank) for i in range(len(per_rank[0][n]))) for n in names}
