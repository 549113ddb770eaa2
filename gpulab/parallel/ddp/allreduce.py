"""Gradient all-reduce for data parallelism: the naive way, then buckets (lab 06).

Every rank holds a full copy of the model and computes gradients on its own slice of the batch.
Averaging those gradients over the ranks (``all_reduce`` then ``/ world_size``) gives each rank
the gradient of the *whole* batch, so every replica takes the same optimizer step and the
replicas stay identical: after k steps the parameters equal single-process training on the full
batch (the tests check exactly that).

- :class:`NaiveDDP` all-reduces every gradient, one tensor at a time, after ``backward()``.
- :class:`BucketedDDP` packs gradients into buckets of ``bucket_size_mb`` and starts a bucket's
  all-reduce (asynchronously) the moment its last gradient is ready, while backward is still
  computing the earlier layers; it waits for them at the end of backward.

This is the design of ``torch.nn.parallel.DistributedDataParallel`` (Li et al., "PyTorch
Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020) and of picotron's
``DataParallelNaive`` / ``DataParallelBucket``. Use torch's DDP for real work; these two exist
to show what it does, and to be measured against it.

Usage (inside a rank started by :func:`gpulab.parallel.ddp.launch`)::

    model = BucketedDDP(Net(), bucket_size_mb=1)     # or NaiveDDP(Net())
    loss_fn(model(inputs), targets).backward()
    model.sync_gradients()                           # all-reduce (naive) / wait (bucketed)
    optimizer.step()
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from gpulab.devices.batches import tree_tensors

__all__ = ["allreduce_gradients", "NaiveDDP", "BucketedDDP", "bucket_assignment", "unused_parameters"]


class _DataParallelBase(nn.Module):
    """Wraps ``module``; at construction copies rank 0's parameters and buffers to every rank."""

    def __init__(self, module: nn.Module, broadcast_buffers: bool = True, process_group: Any = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(f"{type(self).__name__} needs an initialised process group; create it inside a rank "
                               "started by gpulab.parallel.ddp.launch (or torchrun + init_process_group)")
        self.module = module
        self.group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.broadcast_buffers = broadcast_buffers
        self._src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        self.require_sync = True  # False inside no_sync(): gradients only accumulate locally
        with torch.no_grad():  # replicas must start identical, or they never become identical
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=self._src, group=process_group)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self.world_size > 1:
            with torch.no_grad():  # e.g. BatchNorm running stats: rank 0's are the truth, as in torch DDP
                for b in self.module.buffers():
                    dist.broadcast(b, src=self._src, group=self.group)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip the gradient all-reduce inside this block; the gradients accumulate locally in ``.grad``.

        Gradient accumulation over k micro-batches: run the first k-1 backward passes inside
        ``no_sync()`` and the last one outside, which all-reduces the accumulated sum once: k times
        fewer all-reduce calls, and the same gradients as one step on the k micro-batches together
        (as ``torch.nn.parallel.DistributedDataParallel.no_sync``).

        Warning:
            If the last micro-batch is inside ``no_sync()`` too, nothing is ever averaged: each
            rank steps with its own gradients and the replicas silently drift apart.
        """
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]


def allreduce_gradients(model: nn.Module, world_size: int, group: Any = None) -> int:
    """Average every parameter's gradient over the ranks, one all-reduce per tensor.

    Call it after ``loss.backward()`` and before ``optimizer.step()``, on every rank.

    Args:
        model: this rank's replica.
        world_size: the number of ranks (the sum is divided by it).
        group: the process group (default: all ranks).

    Returns:
        The number of all-reduce calls made (one per parameter that requires a gradient).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:  # every rank must make the same calls, in the same order
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)  # in place: now the sum over ranks
        p.grad.div_(world_size)
    return len(params)


class NaiveDDP(_DataParallelBase):
    """All-reduce each gradient separately, after backward has finished.

    Correct, and slow in practice for two reasons: (1) one collective per parameter tensor, so a
    ResNet-50 pays the fixed latency of ~160 all-reduces every step; (2) nothing is sent until the
    whole backward pass is over, so the network idles during compute and the compute units idle
    during communication. :class:`BucketedDDP` fixes both.

    Warning:
        A parameter that got no gradient (an unused branch) gets a zero gradient here, so that
        every rank calls the same all-reduces; an optimizer with momentum or weight decay will
        then still move it.
    """

    def sync_gradients(self) -> int:
        """Average every gradient over the ranks (nothing inside ``no_sync()``). Returns the all-reduce calls made."""
        if not self.require_sync:
            return 0
        return allreduce_gradients(self.module, self.world_size, self.group)


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
    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        offsets = [0]
        for p in params:
            offsets.append(offsets[-1] + p.numel())
        self.slices = {id(p): (offsets[i], offsets[i + 1]) for i, p in enumerate(params)}
        self.ready: set[int] = set()
        self.work: Any = None

    def view(self, p: nn.Parameter) -> torch.Tensor:
        lo, hi = self.slices[id(p)]
        return self.buffer[lo:hi].view_as(p)


class BucketedDDP(_DataParallelBase):
    """Overlap the gradient all-reduce with backward by reducing buckets as they fill up.

    A ``register_post_accumulate_grad_hook`` on every parameter copies its gradient into its
    bucket's flat buffer. When a bucket's last gradient arrives, its all-reduce starts with
    ``async_op=True`` and backward carries on with the earlier layers. A callback queued on the
    autograd engine runs when backward ends: it waits for every bucket, then copies the averages
    back into ``p.grad``. Buckets are launched strictly in order (bucket 1 only after bucket 0),
    because ranks must issue collectives in the same order.

    Args:
        module: the model (already on this rank's device).
        bucket_size_mb: bucket capacity in MiB (torch DDP's default is 25).
        find_unused_parameters: give parameters that got no gradient a zero gradient at the end of
            backward, instead of raising. Costs a check every step, as in torch DDP.
        broadcast_buffers: copy rank 0's buffers to every rank before each forward.
        assign_buckets: ``f(params, bucket_size_mb) -> [[index, ...], ...]``, how parameters are
            grouped (default :func:`bucket_assignment`); lab 06 plugs in the student's version.

    Raises:
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
        self._names = {id(p): n for n, p in module.named_parameters()}
        self.find_unused_parameters = find_unused_parameters
        self._next = 0  # index of the next bucket to launch
        self._callback_queued = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        if not self.require_sync:  # inside no_sync(): p.grad keeps accumulating, nothing is sent
            return
        if not self._callback_queued:  # first gradient of this backward pass
            self._callback_queued = True
            # private API, as torch DDP's reducer uses it: the only hook that runs once the whole backward
            # pass is done (after the last gradient), where the remaining buckets are waited for
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        bucket = self._bucket_of[id(p)]
        bucket.view(p).copy_(p.grad)
        bucket.ready.add(id(p))
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and len(self.buckets[self._next].ready) == len(self.buckets[self._next].params):
            b = self.buckets[self._next]
            b.buffer.div_(self.world_size)  # average = sum of (grad / world_size)
            b.work = dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            self._next += 1

    def _finish_backward(self) -> None:
        self._callback_queued = False
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
            for p in missing:  # unused this step: contribute zeros, as torch DDP does
                b = self._bucket_of[id(p)]
                b.view(p).zero_()
                b.ready.add(id(p))
            self._launch_ready()
            for b in self.buckets:
                b.work.wait()
                for p in b.params:
                    if p.grad is None:
                        p.grad = b.view(p).clone()
                    else:
                        p.grad.copy_(b.view(p))
        finally:
            for b in self.buckets:
                b.ready.clear()
                b.work = None
            self._next = 0

    def sync_gradients(self) -> int:
        """Nothing left to do (backward already waited for the buckets). Returns the bucket count (0 in no_sync)."""
        return len(self.buckets) if self.require_sync else 0


def unused_parameters(model: nn.Module, *inputs: Any) -> list[str]:
    """Names of the parameters that get no gradient from ``model(*inputs)``.

    These are what make torch DDP fail with "Expected to have finished reduction in the prior
    iteration" unless it is built with ``find_unused_parameters=True``. The check runs on a deep
    copy, so ``model``'s gradients are left alone.
    """
    probe = copy.deepcopy(model)
    probe.zero_grad(set_to_none=True)
    out = probe(*inputs)
    tensors = tree_tensors(out)
    sum(t.float().sum() for t in tensors if t.requires_grad).backward()
    return [name for name, p in probe.named_parameters() if p.requires_grad and p.grad is None]
