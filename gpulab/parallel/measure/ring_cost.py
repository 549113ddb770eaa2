"""The α–β cost of a ring all-reduce, fitted to measurements and used to choose a bucket size (lab 06).

    t(nbytes) = 2(N − 1)·α + 2(N − 1)/N · nbytes · β     # N ranks; α per step, β seconds per byte

(Thakur, Rabenseifner & Gropp, IJHPCA 2005; the ring: Patarasuk & Yuan, JPDC 2009.) One all-reduce
per tensor pays α for each; one bucket pays it once but starts after backward's last gradient.
:func:`predict_sync_seconds` replays a backward that produces gradients last layer first at a steady
byte rate: with ``overlap=True`` (NCCL) a full bucket starts once the previous all-reduce ends; with
``overlap=False`` (gloo ranks sharing cores with backward) the all-reduces add up after backward.

The exercise (masked while lab 06 is graded): :func:`fit_alpha_beta`, :func:`predict_sync_seconds`,
:func:`best_bucket_size`. Instruments: :func:`ring_allreduce_seconds`, :func:`allreduce_seconds` (a
rank body for :func:`gpulab.parallel.launch`), :func:`backward_seconds`.
Run: ``pytest tests/parallel/measure/test_ring_cost.py``; the derivation is in lab 06, section 9.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gpulab.parallel.ddp.bucketed import bucket_assignment

__all__ = ["ring_allreduce_seconds", "fit_alpha_beta", "predict_sync_seconds", "best_bucket_size",
           "allreduce_seconds", "backward_seconds"]


def ring_allreduce_seconds(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """``2(N − 1)·alpha + 2(N − 1)/N · nbytes · beta``: one ring all-reduce of ``nbytes``."""
    n = world_size
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float], world_size: int) -> tuple[float, float]:
    """Least-squares ``(alpha, beta)`` of :func:`ring_allreduce_seconds` to measured all-reduce times.

    Minimises the sum over measurements of ``((t(nbytes_i) − seconds_i) / seconds_i)²``: relative
    errors, because the sizes span orders of magnitude and plain seconds would let the largest
    size decide alone (α would come out of the noise, often negative). Nothing is clamped, so the
    result is exactly defined for any data.

    Args:
        nbytes: buffer sizes in bytes, at least two distinct ones.
        seconds: the measured time of one all-reduce at each size.
        world_size: N, at least 2.

    Raises:
        ValueError: mismatched lengths, fewer than two distinct sizes, a time that is not positive,
            or ``world_size < 2``.
    """
    if len(nbytes) != len(seconds):
        raise ValueError(f"{len(nbytes)} sizes but {len(seconds)} times: give one time per size")
    if len(set(nbytes)) < 2:
        raise ValueError("fitting two unknowns needs at least two distinct sizes")
    if world_size < 2:
        raise ValueError(f"an all-reduce over {world_size} rank(s) sends nothing; world_size must be >= 2")
    if any(not t > 0 for t in seconds):
        raise ValueError(f"measured times must be > 0 seconds, got {list(seconds)}")
    n = world_size
    design = torch.tensor([[2.0 * (n - 1) / t, 2.0 * (n - 1) / n * b / t] for b, t in zip(nbytes, seconds)],
                          dtype=torch.float64)                          # (m, 2): each row divided by its time
    target = torch.ones(len(seconds), 1, dtype=torch.float64)           # (m, 1): seconds_i / seconds_i
    alpha, beta = torch.linalg.lstsq(design, target, driver="gelsd").solution.squeeze(1).tolist()
    return alpha, beta


def predict_sync_seconds(params: Sequence[torch.Tensor], backward_s: float, bucket_size_mb: float, world_size: int,
                         alpha: float, beta: float, overlap: bool = True,
                         assign_buckets: Callable[[list, float], list[list[int]]] = bucket_assignment) -> float:
    """When, counted from the start of backward, every gradient is averaged.

    The model: backward produces the gradients in reverse parameter order at a steady rate in
    bytes, the last at ``backward_s``; buckets are ``assign_buckets(params, bucket_size_mb)``, each
    all-reduce takes :func:`ring_allreduce_seconds` of its bytes. With ``overlap``, a bucket's
    all-reduce starts once its last gradient is ready and the previous bucket's has ended;
    without, the all-reduces run one after the other once backward is done (same cores).

    Args:
        params: the model's parameters in registration order (only sizes matter: meta tensors do).
        backward_s: seconds from the first to the last gradient.
        bucket_size_mb, world_size, alpha, beta: as in :func:`ring_allreduce_seconds` and the buckets.
        overlap: whether communication runs beside backward (see the module docstring).
        assign_buckets: the bucket rule (lists of indices into ``params``, first bucket first).
    """
    params = list(params)
    nbytes = [p.numel() * p.element_size() for p in params]
    buckets = assign_buckets(params, bucket_size_mb)
    cost = [ring_allreduce_seconds(sum(nbytes[i] for i in b), world_size, alpha, beta) for b in buckets]
    if not overlap:
        return backward_s + sum(cost)
    total = sum(nbytes) or 1
    ready, produced = [0.0] * len(params), 0
    for i in reversed(range(len(params))):
        produced += nbytes[i]
        ready[i] = backward_s * produced / total
    end = 0.0
    for bucket, seconds in zip(buckets, cost):
        end = max(end, max(ready[i] for i in bucket)) + seconds
    return max(end, backward_s)


def best_bucket_size(params: Sequence[torch.Tensor], backward_s: float, candidates_mb: Sequence[float], world_size: int,
                     alpha: float, beta: float, overlap: bool = True,
                     assign_buckets: Callable[[list, float], list[list[int]]] = bucket_assignment) -> float:
    """The candidate bucket size whose last all-reduce :func:`predict_sync_seconds` ends first (the
    first such candidate on a tie)."""
    if not candidates_mb:
        raise ValueError("give at least one candidate bucket size")
    times = [predict_sync_seconds(params, backward_s, mb, world_size, alpha, beta, overlap, assign_buckets)
             for mb in candidates_mb]
    return candidates_mb[times.index(min(times))]


# --- instruments ----------------------------------------------------------------------------------

def allreduce_seconds(rank: int, world_size: int, sizes_bytes: Sequence[int], repeats: int = 15) -> list[float]:
    """Rank body for :func:`gpulab.parallel.launch`: the median time of one float32 all-reduce of
    each size, all ranks starting together (a barrier before each call). The buffer lives on the
    rank's device (a CUDA one under NCCL, which has no CPU tensors), and on CUDA the clock is read
    once the all-reduce has run, not once it is queued."""
    device = _rank_device()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = []
    for nbytes in sizes_bytes:
        buf = torch.ones(max(1, int(nbytes) // 4), device=device)
        dist.all_reduce(buf)  # warm-up: connections, allocations
        sync()
        times = []
        for _ in range(repeats):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            sync()
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    return out


def _rank_device() -> torch.device:
    """Where this rank's collectives run: its CUDA device under NCCL, else the CPU (gloo)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def backward_seconds(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, repeats: int = 5) -> float:
    """Median seconds of one cross-entropy backward pass of ``model`` (no communication)."""
    times = []
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        t0 = time.perf_counter()
        loss.backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])
