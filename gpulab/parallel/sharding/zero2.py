"""ZeRO stage 2 from scratch: each rank keeps its shard of the gradient and of the optimizer state
(lab 09's exercise after ZeRO-1; Rajbhandari et al., "ZeRO", SC 2020, sections 5.2 and 7.2.1).

No DDP: one step is the all-reduce DDP would make, split into its two halves, with the update between.

1. the model's gradients go into ONE flat buffer, padded to a multiple of ``world_size``;
2. ``reduce_scatter_tensor`` (average) leaves each rank its contiguous shard of the averaged gradient only;
3. the real optimizer (AdamW...) updates this rank's shard of a float32 copy of the parameters:
   its state exists for the shard only, ``1/world_size`` of the model;
4. ``all_gather_into_tensor`` rebuilds the full parameters, copied back into the model.

Inside a rank started by :func:`gpulab.parallel.launch` (``pytest tests/parallel/sharding/test_zero2.py``)::

    opt = ZeRO2Optimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss_fn(model(inputs), targets).backward(); opt.step(); opt.zero_grad()
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from gpulab.parallel.sharding.zero1 import _check_optimizer_cls

__all__ = ["ZeRO2Optimizer"]


class ZeRO2Optimizer:
    """ZeRO stage 2 over one flat buffer: a reduce-scatter of the gradients, the update of this
    rank's shard, an all-gather of the parameters. Use it *instead of* DDP, not on top of it.

    Attributes:
        shard: this rank's float32 master copy, elements ``[rank * shard_size, (rank + 1) * shard_size)``
            of the flattened, padded parameters; the only tensor ``local_optimizer`` updates.
        local_optimizer: ``optimizer_cls([shard], **kwargs)``: its state covers the shard only.

    Args:
        params: the model's parameters, the same on every rank, in the same order; all must
            require grad and live on one device.
        optimizer_cls: the optimizer to shard, called as ``optimizer_cls([shard], **kwargs)``.
        process_group: the ranks that share the work (default: all).
        **kwargs: the options of ``optimizer_cls`` (``lr=...``, ``weight_decay=...``).

    Raises:
        RuntimeError: when no process group is initialised.
        ValueError: when ``params`` is empty, holds a parameter that does not require grad, or
            spans several devices.
        TypeError: when ``optimizer_cls`` is not an optimizer class.

    Warning:
        A parameter whose ``.grad`` is None at ``step()`` is updated with a zero gradient (its
        moments decay, weight decay applies), where torch's optimizers would skip it. Every
        rank must call ``step()``: it is a collective.
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer_cls: Callable[..., torch.optim.Optimizer], *,
                 process_group: Any = None, **kwargs: Any) -> None:
        _check_optimizer_cls(optimizer_cls)
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ZeRO2Optimizer needs an initialised process group: create it inside a rank started by "
                               "gpulab.parallel.launch (or torchrun + torch.distributed.init_process_group)")
        self.params = _checked(params)
        self.group = process_group
        self.rank, self.world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)  # the last shard ends in padding
        flat = self._flatten([p.detach() for p in self.params])  # (world_size * shard_size,), float32
        self.shard = flat[self.rank * self.shard_size:(self.rank + 1) * self.shard_size].clone()  # (shard_size,)
        del flat  # the full copy was needed once, to cut this rank's shard out of it
        try:
            self.local_optimizer = optimizer_cls([self.shard], **kwargs)
        except TypeError as err:
            raise TypeError(f"could not build {getattr(optimizer_cls, '__name__', optimizer_cls)}([shard], **{kwargs}): "
                            f"{err}. optimizer_cls must be a torch.optim.Optimizer class, and the keyword arguments "
                            "its options") from err

    def _flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The tensors, one after the other, in one float32 buffer padded with zeros to a multiple of world_size."""
        flat = torch.zeros(self.world_size * self.shard_size, dtype=torch.float32, device=self.params[0].device)
        for view, t in zip(self._views(flat), tensors):
            view.copy_(t)  # shape_i -> its slice of the flat buffer (casts to float32)
        return flat

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat``'s first ``numel`` elements, cut and shaped as each parameter (views, no copy)."""
        pieces = flat[:self.numel].split([p.numel() for p in self.params])
        return [piece.view(p.shape) for piece, p in zip(pieces, self.params)]  # (numel_i,) -> shape_i

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the model's gradients and this rank's gradient shard (``set_to_none=False``: zero them)."""
        for p in [*self.params, self.shard]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Reduce-scatter the gradients, update this rank's shard, all-gather the parameters."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat_grad = self._flatten(grads)  # (world_size * shard_size,): this rank's full local gradient
        grad_shard = torch.empty_like(self.shard)  # (shard_size,)
        dist.reduce_scatter_tensor(grad_shard, flat_grad, op=dist.ReduceOp.AVG, group=self.group)
        del flat_grad  # freed here: after the step a rank keeps only its shard of the averaged gradient
        self.shard.grad = grad_shard
        self.local_optimizer.step()  # only the shard has state, so only the shard moves
        flat = torch.empty(self.world_size * self.shard_size, dtype=torch.float32, device=self.shard.device)
        dist.all_gather_into_tensor(flat, self.shard, group=self.group)  # (shard_size,) x N -> (N * shard_size,)
        for p, view in zip(self.params, self._views(flat)):
            p.copy_(view)  # every rank holds the whole updated model again; the padding stays behind


def _checked(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    params = list(params)
    if not params:
        raise ValueError("ZeRO2Optimizer got no parameters; pass model.parameters() of a model that has some")
    if isinstance(params[0], dict):
        raise ValueError("ZeRO2Optimizer takes one list of parameters, not param-group dicts: pass "
                         "model.parameters() and the options as keyword arguments")
    if len({id(p) for p in params}) < len(params):
        raise ValueError("a parameter appears twice in params; pass model.parameters(), which lists a shared one once")
    frozen = [i for i, p in enumerate(params) if not p.requires_grad]
    if frozen:
        raise ValueError(f"parameters {frozen} do not require grad: their gradient would be missing from the flat "
                         "buffer; pass only the trained ones: [p for p in model.parameters() if p.requires_grad]")
    devices = {p.device for p in params}
    if len(devices) > 1:
        raise ValueError(f"the parameters span {sorted(map(str, devices))}: one flat buffer needs one device; move "
                         "the model to this rank's device first (model.to(rank_device(rank)))")
    return params
