"""Gradient all-reduce for data parallelism, naive first, then overlapped (lab 06's references).

Each rank computes gradients on its slice of the batch; averaging them (``all_reduce``, then
``/ world_size``) gives every rank the whole batch's gradient, so the replicas take the same step
and stay identical (after k steps: single-process training on the full batch).

- :class:`NaiveDDP`: after ``backward()``, one blocking all-reduce per gradient;
- :class:`OverlappedDDP`: a hook per parameter launches that gradient's all-reduce
  (``async_op=True``) as soon as backward produced it: communication overlaps backward;
- :class:`~gpulab.parallel.ddp.bucketed.BucketedDDP`: the same in a few flat buckets.

Inside a rank started by :func:`gpulab.parallel.launch` (``pytest tests/parallel/ddp/test_allreduce.py``)::

    model = OverlappedDDP(Net()); loss_fn(model(x), y).backward(); model.finish(); optimizer.step()
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpulab.devices.batches import tree_tensors
from gpulab.parallel.ddp.bucketed import BucketedDDP, bucket_assignment
from gpulab.parallel.ddp.wrapper import DataParallelWrapper, at_end_of_backward

__all__ = ["allreduce_gradients", "NaiveDDP", "OverlappedDDP", "BucketedDDP", "bucket_assignment",
           "unused_parameters"]


def allreduce_gradients(model: nn.Module, world_size: int, group: Any = None) -> int:
    """Average every parameter's gradient over the ranks, one blocking all-reduce per tensor.

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


class NaiveDDP(DataParallelWrapper):
    """All-reduce each gradient separately, after backward has finished.

    Correct, and slow in practice for two reasons: (1) one collective per parameter tensor, so a
    ResNet-50 pays the fixed latency of ~160 all-reduces every step; (2) nothing is sent until the
    whole backward pass is over, so the network idles during compute and the compute units idle
    during communication. :class:`OverlappedDDP` fixes (2), :class:`BucketedDDP` both.

    Warning:
        A parameter that got no gradient (an unused branch) gets a zero gradient here, so that
        every rank calls the same all-reduces; an optimizer with momentum or weight decay will
        then still move it.
    """

    def finish(self) -> int:
        """Average every gradient over the ranks now (nothing inside ``no_sync()``). Returns the calls made."""
        if not self.require_sync:
            return 0
        return allreduce_gradients(self.module, self.world_size, self.group)


class OverlappedDDP(DataParallelWrapper):
    """One asynchronous all-reduce per gradient, launched from that parameter's hook during backward.

    ``Tensor.register_post_accumulate_grad_hook`` runs once per backward pass, after the
    parameter's ``.grad`` holds everything this pass adds to it (a weight used twice, as in a
    tied embedding, fires once, with the sum). The hook divides the gradient by the world size
    and starts ``all_reduce(p.grad, async_op=True)``; backward carries on with earlier layers
    while the gradient travels. When backward ends, a callback on the autograd engine waits for
    every handle, as torch DDP does, so ``.grad`` is final when ``backward()`` returns.

    Better than :class:`NaiveDDP` (communication overlaps compute), but still one collective per
    tensor: many small all-reduces each pay a fixed cost. :class:`BucketedDDP` fixes that.

    Warning:
        A parameter no rank uses is simply never all-reduced (its ``.grad`` stays None, as in one
        process). A parameter used on some ranks only would make the ranks call different
        collectives and hang or mix them up: :class:`BucketedDDP` with
        ``find_unused_parameters=True`` handles that case.
    """

    def __init__(self, module: nn.Module, broadcast_buffers: bool = True, process_group: Any = None):
        super().__init__(module, broadcast_buffers, process_group)
        self._handles: list[Any] = []
        self._done = 0  # all-reduces the last complete backward pass waited for
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self._params()]

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        if not self.require_sync:  # inside no_sync(): p.grad keeps accumulating, nothing is sent
            return
        if not self._handles:  # the first gradient of this backward pass
            at_end_of_backward(self._wait_all)
        p.grad.div_(self.world_size)  # average = sum of (grad / world_size)
        self._handles.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group, async_op=True))

    def _wait_all(self) -> None:
        for handle in self._handles:
            handle.wait()
        self._done = len(self._handles)
        self._handles.clear()

    def finish(self) -> int:
        """Nothing left to wait for (backward did). Returns the all-reduces of the last backward pass."""
        done, self._done = self._done, 0
        return done


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
