"""Bucketed, overlapped gradient all-reduce: a simplified torch DDP reducer (lab 06's reference).

1. :func:`bucket_assignment` groups the parameters, **last to first** (the order backward makes
   their gradients), into buckets of at most ``bucket_size_mb``;
2. a ``register_post_accumulate_grad_hook`` per parameter copies its gradient into its slice of
   the bucket's flat buffer;
3. a full bucket's ``all_reduce(buffer, async_op=True)`` starts **in bucket order** (every rank
   must call the same collectives in the same order);
4. at the end of backward, buckets still waiting for an unused parameter go with zeros in its
   place; every handle is waited for and the averages copied back into ``.grad``.

Unused parameters follow torch DDP with ``find_unused_parameters=True`` (one more all-reduce
counts the ranks that used each). How torch's reducer differs: the comment below the imports.
Inside a rank: ``BucketedDDP(Net(), bucket_size_mb=1)``; ``pytest tests/parallel/ddp/test_allreduce.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from gpulab.parallel.ddp.wrapper import DataParallelWrapper, at_end_of_backward

# Torch's reducer (``torch/csrc/distributed/c10d/reducer.cpp``) starts with one bucket (when
# ``find_unused_parameters=False``), then rebuilds its buckets in the order the gradients were ready,
# closing a bucket once it *reaches* the cap, the first at 1 MiB: ``gpulab.parallel.ddp.rebuild``.

__all__ = ["bucket_assignment", "BucketedDDP"]


def bucket_assignment(params: Iterable[nn.Parameter], bucket_size_mb: float) -> list[list[int]]:
    """Group parameters into buckets of at most ``bucket_size_mb`` MiB, in reverse order.

    Backward produces gradients roughly from the last layer to the first, so walking the
    parameters in reverse puts gradients that are ready together in the same bucket. A parameter
    larger than a bucket gets a bucket of its own; a bucket never mixes dtypes or devices (it is
    one flat tensor).

    Args:
        params: the model's parameters, in registration order (``model.parameters()``).
        bucket_size_mb: the bucket capacity in MiB (> 0).

    Returns:
        Lists of indices into ``params``; the first bucket holds the last parameters.

    Raises:
        ValueError: when ``bucket_size_mb`` is not positive.
    """
    if not bucket_size_mb > 0:
        raise ValueError(f"bucket_size_mb must be > 0, got {bucket_size_mb!r}")
    cap = bucket_size_mb * 2**20
    params = list(params)
    buckets: list[list[int]] = []
    size, kind = 0.0, None
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if buckets and size + nbytes <= cap and kind == (p.dtype, p.device):
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size, kind = nbytes, (p.dtype, p.device)
    return buckets


class _Bucket:
    """One flat buffer holding several gradients, and the handle of its all-reduce."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        # (sum of numel,): every gradient of the bucket, flattened end to end
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        offsets = [0]
        for p in params:
            offsets.append(offsets[-1] + p.numel())
        self.slices = {id(p): (offsets[i], offsets[i + 1]) for i, p in enumerate(params)}
        self.ready: set[int] = set()
        self.work: Any = None

    def view(self, p: nn.Parameter) -> torch.Tensor:
        lo, hi = self.slices[id(p)]
        return self.buffer[lo:hi].view_as(p)  # (numel,) -> p's shape; a view: writing it writes the bucket


class BucketedDDP(DataParallelWrapper):
    """Overlap the gradient all-reduce with backward by reducing buckets as they fill up.

    Args:
        module: the model (already on this rank's device).
        bucket_size_mb: bucket capacity in MiB (torch DDP's ``bucket_cap_mb``, default 25).
        find_unused_parameters: handle parameters that get no gradient (see the module docstring)
            instead of raising. Costs one extra all-reduce every step, as in torch DDP.
        broadcast_buffers: copy rank 0's buffers to every rank before each forward.
        process_group: the group to average over (default: every rank).
        assign_buckets: ``f(params, bucket_size_mb) -> [[index, ...], ...]``, how parameters are
            grouped (default :func:`bucket_assignment`).

    Raises:
        ValueError: a bucket plan that misses or repeats a parameter, or mixes dtypes/devices.
        RuntimeError: at the end of a backward pass that left parameters without gradients, when
            ``find_unused_parameters`` is False (the message names them).
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25.0, find_unused_parameters: bool = False,
                 broadcast_buffers: bool = True, process_group: Any = None,
                 assign_buckets: Callable[[list[nn.Parameter], float], list[list[int]]] | None = None):
        super().__init__(module, broadcast_buffers, process_group)
        params = self._params()
        plan = (assign_buckets or bucket_assignment)(params, bucket_size_mb)
        flat = sorted(i for b in plan for i in b)
        if flat != list(range(len(params))) or not all(plan):
            raise ValueError(f"assign_buckets must return non-empty buckets holding every parameter index 0.."
                             f"{len(params) - 1} exactly once; got {plan}")
        if any(len({(params[i].dtype, params[i].device) for i in b}) > 1 for b in plan):
            raise ValueError("a bucket mixes dtypes or devices; it must be one flat tensor")
        self.buckets = [_Bucket([params[i] for i in b]) for b in plan]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._index = {id(p): i for i, p in enumerate(params)}
        self._names = {id(p): n for n, p in module.named_parameters()}
        self.find_unused_parameters = find_unused_parameters
        # how many ranks used each parameter this step (all-reduced only with find_unused_parameters)
        self._used = torch.zeros(len(params), dtype=torch.int32, device=params[0].device if params else None)
        self._next = 0  # index of the next bucket to launch
        self._in_backward = False
        self._done = 0  # all-reduces of the last complete backward pass
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        if not self.require_sync:  # inside no_sync(): p.grad keeps accumulating, nothing is sent
            return
        if not self._in_backward:  # the first gradient of this backward pass
            self._in_backward = True
            at_end_of_backward(self._finish_backward)
        bucket = self._bucket_of[id(p)]
        bucket.view(p).copy_(p.grad)
        bucket.ready.add(id(p))
        self._used[self._index[id(p)]] = 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch every full bucket from ``_next`` on, stopping at the first that is not full."""
        while self._next < len(self.buckets) and len(self.buckets[self._next].ready) == len(self.buckets[self._next].params):
            b = self.buckets[self._next]
            b.buffer.div_(self.world_size)  # average = sum of (grad / world_size)
            b.work = dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            self._next += 1

    def _finish_backward(self) -> None:
        try:
            missing = [p for b in self.buckets[self._next:] for p in b.params if id(p) not in b.ready]
            if missing and not self.find_unused_parameters:
                for b in self.buckets[: self._next]:
                    b.work.wait()  # leave no collective half-done behind the error
                names = ", ".join(self._names.get(id(p), "?") for p in missing[:8])
                raise RuntimeError(
                    f"{len(missing)} parameter(s) received no gradient in this backward pass ({names}); their "
                    "buckets could never be reduced. Pass find_unused_parameters=True if parts of the model are "
                    "legitimately unused in some steps, or remove those parameters.")
            for p in missing:  # unused here: contribute zeros, so that the bucket can go
                b = self._bucket_of[id(p)]
                b.view(p).zero_()
                b.ready.add(id(p))
            self._launch_ready()
            calls = len(self.buckets)
            used = None
            if self.find_unused_parameters:  # how many ranks used each parameter
                dist.all_reduce(self._used, op=dist.ReduceOp.SUM, group=self.group)
                used = self._used.tolist()
                calls += 1
            for b in self.buckets:
                b.work.wait()
                for p in b.params:
                    if used is not None and used[self._index[id(p)]] == 0:
                        continue  # no rank used it: .grad stays as it was, as in torch DDP
                    if p.grad is None:
                        p.grad = b.view(p).clone()
                    else:
                        p.grad.copy_(b.view(p))
            self._done = calls
        finally:
            for b in self.buckets:
                b.ready.clear()
                b.work = None
            self._used.zero_()
            self._next = 0
            self._in_backward = False

    def finish(self) -> int:
        """Nothing left to wait for (backward did). Returns the all-reduces of the last backward pass."""
        done, self._done = self._done, 0
        return done
