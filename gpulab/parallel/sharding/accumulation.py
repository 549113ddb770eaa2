"""Gradient accumulation with ``no_sync``, and counters of the collectives a rank calls (lab 09).

k micro-batches add their gradients up in ``.grad`` (each loss divided by k), then one optimizer
step. Under data parallelism each backward would also all-reduce: ``no_sync()`` (torch DDP's, and
:class:`~gpulab.parallel.NaiveDDP`'s / :class:`~gpulab.parallel.BucketedDDP`'s) skips it for the
first k-1 micro-batches, and the last backward averages the accumulated sum once:

1. micro-batches 0 .. k-2, inside ``model.no_sync()``: ``(loss_fn(model(x), y) / k).backward()``;
2. micro-batch k-1, outside: the same, then ``model.sync_gradients()``;
3. ``optimizer.step()``; ``optimizer.zero_grad()``.

The parameters equal one step on the k micro-batches together, with k times fewer all-reduce
calls (``pytest tests/parallel/sharding/test_zero1.py``)::

    with count_collectives() as calls:
        accumulation_step(model, optimizer, micro_batches, loss_fn)
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["accumulation_step", "count_collectives", "C10dOps", "torch_ddp_allreduce_calls", "COUNTED"]

COUNTED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor")


def accumulation_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                      micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                      loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One optimizer step accumulated over ``micro_batches``, synchronising the gradients once.

    Args:
        model: a :class:`~gpulab.parallel.NaiveDDP` or :class:`~gpulab.parallel.BucketedDDP`
            (anything with ``no_sync()`` and ``sync_gradients()``).
        optimizer: the optimizer of ``model``'s parameters.
        micro_batches: ``[(inputs, targets), ...]``, k micro-batches of equal size.
        loss_fn: mean-reduced loss, ``loss_fn(outputs, targets)``.

    Returns:
        The mean loss over the micro-batches (detached).

    Raises:
        ValueError: when ``micro_batches`` is empty.
    """
    if not micro_batches:
        raise ValueError("micro_batches is empty; pass at least one (inputs, targets) pair")
    k = len(micro_batches)
    total = torch.zeros(())
    for i, (inputs, targets) in enumerate(micro_batches):
        last = i == k - 1
        with model.no_sync() if not last else contextlib.nullcontext():
            loss = loss_fn(model(inputs), targets) / k  # the sum of k of these is the big batch's mean
            loss.backward()
            model.sync_gradients()  # a no-op inside no_sync; the one all-reduce on the last micro-batch
        total += loss.detach().cpu()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


class count_collectives:  # used like a function: `with count_collectives() as calls`
    """Count the ``torch.distributed`` collectives called in this process while the block runs.

    It wraps the Python functions named in :data:`COUNTED` (``dist.all_reduce``...), so it counts
    what gpulab's wrappers and your code call through ``torch.distributed``; torch DDP's C++
    reducer and FSDP2 call the process group directly and are not counted.

    Yields:
        A ``collections.Counter``: ``calls["all_reduce"]`` is the number of all-reduce calls.
    """

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._saved: dict[str, Callable[..., Any]] = {}

    def __enter__(self) -> Counter[str]:
        for name in COUNTED:
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._saved[name] = original

            def counted(*args: Any, _name: str = name, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
                self.calls[_name] += 1
                return _original(*args, **kwargs)

            setattr(dist, name, counted)
        return self.calls

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved.clear()


class C10dOps(TorchDispatchMode):
    """Every collective that reaches PyTorch's dispatcher, whatever name it was called by (FSDP2's and
    DTensor's included): ``counts[op name]``, waits and barriers left out. ``with C10dOps() as ops:``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = str(func)
        if name.startswith(("c10d.", "_c10d_functional.")) and "wait" not in name and "barrier" not in name:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def count(self) -> int:
        """All the collectives counted."""
        return sum(self.counts.values())

    @property
    def all_gathers(self) -> int:
        """The all-gathers among them (``c10d._allgather_base_``, ``all_gather_into_tensor``...)."""
        return sum(n for name, n in self.counts.items() if "allgather" in name.replace("_", ""))


def torch_ddp_allreduce_calls(rank: int, world_size: int, micro_batches: int = 4) -> dict[str, int]:
    """Rank body: all-reduces torch DDP makes for one accumulated step, as ``torch.profiler`` records them.

    torch DDP's reducer runs in C++, out of :class:`count_collectives`' reach; the profiler sees its
    ``c10d::allreduce_`` calls. Returns ``{"no_sync": calls, "every_micro_batch": calls}``.
    """
    from torch.profiler import ProfilerActivity, profile

    from gpulab.parallel.launcher import rank_device

    device = rank_device(rank)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).to(device),
                                                device_ids=[device.index] if device.type == "cuda" else None)
    inputs = torch.randn(micro_batches, 8, 16, device=device)  # (k, B, features): k micro-batches
    out = {}
    for name, use_no_sync in (("no_sync", True), ("every_micro_batch", False)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i, x in enumerate(inputs):
                skip = use_no_sync and i < micro_batches - 1
                with model.no_sync() if skip else contextlib.nullcontext():
                    model(x).square().mean().backward()
        out[name] = sum(1 for e in prof.events() if e.name.startswith("c10d::allreduce"))
        model.zero_grad()
    return out
