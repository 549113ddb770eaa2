"""Bytes and times of a tensor-parallel block, measured inside ranks (lab 11).

    from gpulab.parallel import launch
    from gpulab.parallel.tp import TensorParallelMLP, timing
    launch(timing.measure_bytes, 2, args=(TensorParallelMLP, 64, 256, 32))    # per rank: bytes held
    launch(timing.comm_compute_sweep, 2, args=([64, 256, 1024], 256))          # per hidden size: seconds

- :func:`measure_bytes`: the weights, gradients and saved activations one rank holds after a step
  (compare with :func:`~gpulab.parallel.tp.memory.analytic_mlp_bytes`);
- :func:`time_block` / :func:`time_single`: seconds per training step of the TP block in ranks, and
  of the full block in one process;
- :func:`comm_compute_sweep`: per hidden size, the forward matmuls of one rank's shard against the
  all-reduce of the output: the plot behind the lab's written answer.

On a CPU the ranks share the cores and talk through gloo over loopback TCP: these times say how
the arithmetic splits, not what NVLink would do (see :mod:`gpulab.parallel.tp.cost`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from gpulab.parallel.launcher.startup import rank_device
from gpulab.parallel.tp.memory import grad_bytes, parameter_bytes, saved_activation_bytes
from gpulab.parallel.tp.mlp import feed_forward

__all__ = ["measure_bytes", "time_block", "time_single", "comm_compute_sweep"]

Make = Callable[[nn.Module, int, int], nn.Module]


def measure_bytes(rank: int, world_size: int, make: Make, hidden: int, ffn: int, tokens: int, seed: int = 0) -> dict[str, int]:
    """Rank body: ``make(feed_forward(hidden, ffn), rank, world_size)``, one step on ``(tokens, hidden)``.

    Returns:
        ``weights`` (2-D parameters), ``params``, ``grads`` and ``activations`` (bytes saved for
        backward, parameters excluded), counted from this rank's tensors.
    """
    device = rank_device(rank)
    tp = make(feed_forward(hidden, ffn, seed).to(device), rank, world_size)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed)).to(device).requires_grad_()
    y, activations = saved_activation_bytes(lambda: tp(x), exclude=tp)
    y.sum().backward()
    return {"weights": parameter_bytes(tp, matrices_only=True), "params": parameter_bytes(tp),
            "grads": grad_bytes(tp), "activations": activations}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a host-device sync: time the kernels, not their launch


def _median_step(block: nn.Module, x: torch.Tensor, num_steps: int, warmup: int, barrier: bool) -> float:
    times = []
    for step in range(warmup + num_steps):
        if barrier:
            dist.barrier()  # every rank starts the step together
        t0 = time.perf_counter()
        block(x).sum().backward()
        _sync(x.device)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_block(rank: int, world_size: int, make: Make, hidden: int, tokens: int, num_steps: int = 10,
               warmup: int = 2, seed: int = 0) -> float:
    """Rank body: median seconds per forward + backward of this rank's share of ``feed_forward(hidden)``."""
    device = rank_device(rank)
    tp = make(feed_forward(hidden, 4 * hidden, seed).to(device), rank, world_size)
    x = torch.randn(tokens, hidden, device=device, requires_grad=True)
    return _median_step(tp, x, num_steps, warmup, barrier=True)


def time_single(hidden: int, tokens: int, num_steps: int = 10, warmup: int = 2, seed: int = 0,
                device: str | torch.device = "cpu") -> float:
    """Median seconds per forward + backward of the full ``feed_forward(hidden)`` in this process."""
    device = torch.device(device)
    x = torch.randn(tokens, hidden, device=device, requires_grad=True)
    return _median_step(feed_forward(hidden, 4 * hidden, seed).to(device), x, num_steps, warmup, barrier=False)


def comm_compute_sweep(rank: int, world_size: int, hiddens: Sequence[int], tokens: int, repeats: int = 5) -> dict[int, dict[str, Any]]:
    """Rank body: per hidden size h, the median seconds of this rank's forward matmuls
    (``(tokens, h) @ (h, 4h/N)`` then ``(tokens, 4h/N) @ (4h/N, h)``) and of the all-reduce of the
    ``(tokens, h)`` output, timed separately so neither hides the other.

    Returns:
        ``{h: {"compute_s": s, "comm_s": s, "bytes": output bytes}}`` (each rank's own timing).
    """
    out = {}
    device = rank_device(rank)
    for h in hiddens:
        local = 4 * h // world_size
        x = torch.randn(tokens, h, device=device)
        w1 = torch.randn(local, h, device=device) / h**0.5
        w2 = torch.randn(h, local, device=device) / local**0.5
        compute, comm = [], []
        for _ in range(repeats + 1):  # the first round warms gloo's buffers and the allocator
            dist.barrier()
            t0 = time.perf_counter()
            partial = F.linear(F.gelu(F.linear(x, w1)), w2)  # (tokens, h)
            _sync(device)
            t1 = time.perf_counter()
            dist.all_reduce(partial)
            _sync(device)
            t2 = time.perf_counter()
            compute.append(t1 - t0)
            comm.append(t2 - t1)
        out[h] = {"compute_s": statistics.median(compute[1:]), "comm_s": statistics.median(comm[1:]),
                  "bytes": tokens * h * 4}
    return out
