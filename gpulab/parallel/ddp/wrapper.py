"""What every data-parallel wrapper of lab 06 shares: identical replicas, buffers from rank 0, ``no_sync``.

:class:`DataParallelWrapper` is the base of :class:`~gpulab.parallel.NaiveDDP`,
:class:`~gpulab.parallel.OverlappedDDP` and :class:`~gpulab.parallel.BucketedDDP`. Like
``torch.nn.parallel.DistributedDataParallel`` it

1. broadcasts rank 0's parameters and buffers when it is built (replicas that start different
   never become identical: averaging equal gradients keeps a difference, it does not remove it);
2. broadcasts rank 0's buffers (BatchNorm's running statistics) before every forward;
3. offers ``no_sync()``: inside it, backward only accumulates ``.grad`` locally (lab 09).

The subclasses decide *when* the gradients are averaged; each has ``finish()``, which returns
once they are (``sync_gradients()`` is the same method under lab 09's name).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DataParallelWrapper", "at_end_of_backward"]


def at_end_of_backward(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the current backward pass has computed every gradient.

    Call it from inside a backward hook. This is how torch DDP's reducer waits for its buckets
    without an explicit call after ``backward()``. It is private API
    (``Variable._execution_engine.queue_callback``), the only hook that runs after the last
    gradient of a backward pass; student code waits in an explicit ``finish()`` instead.
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class DataParallelWrapper(nn.Module):
    """Wraps ``module``; at construction copies rank 0's parameters and buffers to every rank.

    Args:
        module: the model, already on this rank's device.
        broadcast_buffers: copy rank 0's buffers to every rank before each forward.
        process_group: the group to average over (default: every rank).

    Raises:
        RuntimeError: when no process group is initialised (the message says how to start ranks).
    """

    def __init__(self, module: nn.Module, broadcast_buffers: bool = True, process_group: Any = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(f"{type(self).__name__} needs an initialised process group; create it inside a rank "
                               "started by gpulab.parallel.launcher.launch (or torchrun + init_process_group)")
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

    def finish(self) -> int:
        """Return once every gradient is averaged; call it after backward, before ``optimizer.step()``.

        Returns:
            The all-reduce calls that synchronised this step (0 inside ``no_sync()``).
        """
        raise NotImplementedError

    def sync_gradients(self) -> int:
        """Lab 09's name for :meth:`finish`."""
        return self.finish()

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]
