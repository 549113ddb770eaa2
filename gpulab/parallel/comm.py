"""Transfers between logical devices: the collectives DataParallel is made of, differentiable.

``torch.nn.parallel`` builds DataParallel from ``torch.cuda.comm`` (broadcast, scatter, gather,
reduce_add) wrapped in autograd Functions (``torch/nn/parallel/_functions.py``). These are the same
operations between :class:`~gpulab.devices.LogicalDevice`\\ s, so they also run on a laptop:

- :func:`to` copies a tensor to another logical device. The copy is real even when both logical
  devices share one physical device, so a meter sees (and a budget limits) the memory it takes.
  Its backward sends the gradient back to the source device.
- :func:`broadcast`, :func:`scatter` (``torch.chunk`` semantics), :func:`gather`,
  :func:`reduce_add` are built the same way, with the gradient of each being the other's
  (scatter <-> gather, broadcast <-> reduce_add), as in torch.

On real GPUs the copies are real device-to-device copies (``Tensor.to``). Every result is recorded
as living on its logical device (see :func:`gpulab.devices.placement`).

Example::

    devices = logical_devices(4)
    chunks = scatter(batch, devices)                 # 4 pieces, one per device
    outs = [replica(x) for replica, x in zip(replicas, chunks)]
    out = gather(outs, devices[0])                   # the output device gets it all
"""

from __future__ import annotations

from typing import Sequence, TypeVar, overload

import torch
from torch import nn

from gpulab.devices import logical
from gpulab.devices.logical import LogicalDevice
from gpulab.devices.registry import placement, tag
from gpulab.devices.validate import check_device, check_devices

__all__ = ["to", "broadcast", "scatter", "gather", "reduce_add"]

M = TypeVar("M", bound=nn.Module)


def _check_tensor(tensor: object, what: str = "tensor") -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def _copy(tensor: torch.Tensor, dst: LogicalDevice, non_blocking: bool = False) -> torch.Tensor:
    """A new tensor on ``dst`` holding ``tensor``'s values (never a view, never the input)."""
    with logical.placing(dst):  # a meter counts the copy on dst, not on the input's device
        out = tensor.to(dst.physical, non_blocking=non_blocking, copy=True)
    tag(out, dst)
    return out


def _move(tensor: torch.Tensor, src: LogicalDevice, dst: LogicalDevice) -> torch.Tensor:
    """``tensor`` (on ``src``) on ``dst``, differentiably; itself when ``src == dst``."""
    return tensor if src == dst else _Copy.apply(tensor, src, dst)


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, src: LogicalDevice, dst: LogicalDevice) -> torch.Tensor:
        ctx.src, ctx.dst = src, dst
        return _copy(tensor, dst)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _move(grad, ctx.dst, ctx.src), None, None  # the gradient goes home


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dst: LogicalDevice, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.sources = [placement(t) for t in tensors]
        ctx.sizes = [t.size(dim) for t in tensors]
        ctx.dst, ctx.dim = dst, dim
        shape = list(tensors[0].shape)
        shape[dim] = sum(ctx.sizes)
        # One output buffer on dst, each piece copied straight into its slice, as
        # torch.cuda.comm.gather does: no per-piece temporary on the output device.
        with logical.placing(dst):
            out = torch.empty(shape, dtype=tensors[0].dtype, device=dst.physical)
        offset = 0
        for t, n in zip(tensors, ctx.sizes):
            out.narrow(dim, offset, n).copy_(t)
            offset += n
        tag(out, dst)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        pieces = grad.split(ctx.sizes, ctx.dim)
        return (None, None, *(_move(p, ctx.dst, src) for p, src in zip(pieces, ctx.sources)))


class _ReduceAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dst: LogicalDevice, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.sources = [placement(t) for t in tensors]
        ctx.dst = dst
        with logical.placing(dst):
            out = torch.empty_like(tensors[0], device=dst.physical)
        out.copy_(tensors[0])
        for t, src in zip(tensors[1:], ctx.sources[1:]):
            # A tensor from another device is first copied to dst (a temporary, as a peer copy is
            # on GPUs), then added; one on dst is added in place.
            out.add_(t if src == dst else _copy(t, dst))
        tag(out, dst)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (None, *(_move(grad, ctx.dst, src) for src in ctx.sources))


@overload
def to(tensor: torch.Tensor, dev: LogicalDevice, *, non_blocking: bool = False) -> torch.Tensor: ...
@overload
def to(tensor: M, dev: LogicalDevice, *, non_blocking: bool = False) -> M: ...


def to(tensor, dev, *, non_blocking=False):
    """Send a tensor (or a module's parameters and buffers) to logical device ``dev``.

    A tensor already on ``dev`` is returned as it is (like ``Tensor.to``). Otherwise the result is
    a real copy, also between logical devices that share one physical device, and its gradient in
    backward is copied back to the source device. A module is moved in place, like
    ``Module.to``, and returned: use it to put a model (or one stage of a split model) on a device.

    Args:
        tensor: a tensor, or an ``nn.Module``.
        dev: the destination, one of :func:`~gpulab.devices.logical_devices`.
        non_blocking: passed to ``Tensor.to`` (asynchronous host-to-GPU copies from pinned memory).

    Returns:
        The tensor on ``dev`` (differentiable), or the module itself.

    Raises:
        TypeError: if ``dev`` is not a LogicalDevice (a ``torch.device``, ``"cuda:1"`` or an int).
        ValueError: if ``dev`` is on a GPU this machine does not have, or is not in the ``devices=``
            list of an active :class:`~gpulab.devices.MemoryMeter`.
    """
    dev = check_device(dev)
    if isinstance(tensor, nn.Module):
        module = tensor
        module._apply(lambda t: t if placement(t) == dev else _copy(t, dev, non_blocking))
        return module
    tensor = _check_tensor(tensor)
    src = placement(tensor)
    if src == dev:
        return tensor
    return _Copy.apply(tensor, src, dev)


def broadcast(tensor: torch.Tensor, devices: Sequence[LogicalDevice]) -> list[torch.Tensor]:
    """One copy of ``tensor`` on each device (the tensor itself on its own device, as in torch).

    Backward sums the copies' gradients onto the source device (reduce_add).

    Raises:
        TypeError / ValueError: for a non-tensor, an empty list, a non-LogicalDevice or a device
        listed twice.
    """
    tensor = _check_tensor(tensor)
    devices = check_devices(devices)
    src = placement(tensor)
    return [_move(tensor, src, d) for d in devices]


def scatter(tensor: torch.Tensor, devices: Sequence[LogicalDevice], dim: int = 0) -> list[torch.Tensor]:
    """Split ``tensor`` along ``dim`` with ``torch.chunk`` and send piece ``i`` to ``devices[i]``.

    ``torch.chunk`` semantics: 5 rows over 4 devices gives 3 pieces (2, 2, 1), so the result can
    be shorter than ``devices``; use ``len(result)`` replicas. A piece already on its device is a
    view, not a copy. Backward gathers the gradients onto the source device.

    Raises:
        TypeError / ValueError: as :func:`broadcast`.
    """
    tensor = _check_tensor(tensor)
    devices = check_devices(devices)
    src = placement(tensor)
    return [_move(piece, src, d) for piece, d in zip(tensor.chunk(len(devices), dim), devices)]


def _check_pieces(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence) or not tensors:
        raise ValueError(f"{what} takes a non-empty list of tensors (one per device), got {type(tensors).__name__}")
    tensors = [_check_tensor(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    first = tensors[0]
    for i, t in enumerate(tensors[1:], 1):
        if t.dtype != first.dtype or t.dim() != first.dim():
            raise ValueError(f"{what}: tensors[{i}] is {t.dtype} {tuple(t.shape)}, but "
                             f"tensors[0] is {first.dtype} {tuple(first.shape)}; "
                             "every piece needs the same dtype and number of dimensions")
    return tensors


def gather(tensors: Sequence[torch.Tensor], dev: LogicalDevice, dim: int = 0) -> torch.Tensor:
    """Concatenate the pieces along ``dim`` on ``dev`` (the inverse of :func:`scatter`).

    Like DataParallel's gather, 0-dim tensors (one loss per device) become a vector. The result
    is one buffer on ``dev``; backward sends each piece's gradient back to its device.

    Raises:
        TypeError / ValueError: for a non-LogicalDevice, an empty list, or pieces whose dtype or
        shape (apart from ``dim``) differ.
    """
    dev = check_device(dev)
    tensors = _check_pieces(tensors, "gather")
    if tensors[0].dim() == 0:
        tensors = [t.reshape(1) for t in tensors]  # a view: stays on its device
    ndim = tensors[0].dim()
    if not -ndim <= dim < ndim:
        raise IndexError(f"gather: dim={dim} is out of range for {ndim}-d pieces")
    dim %= ndim
    for i, t in enumerate(tensors[1:], 1):
        if any(a != b for k, (a, b) in enumerate(zip(t.shape, tensors[0].shape)) if k != dim):
            raise ValueError(f"gather: tensors[{i}] has shape {tuple(t.shape)} but tensors[0] has "
                             f"{tuple(tensors[0].shape)}; they may differ along dim={dim} only")
    return _Gather.apply(dev, dim, *tensors)


def reduce_add(tensors: Sequence[torch.Tensor], dev: LogicalDevice) -> torch.Tensor:
    """The elementwise sum of same-shaped tensors from several devices, on ``dev``.

    Backward sends the gradient to every source device (a broadcast).

    Raises:
        TypeError / ValueError: for a non-LogicalDevice, an empty list, or shapes that differ.
    """
    dev = check_device(dev)
    tensors = _check_pieces(tensors, "reduce_add")
    for i, t in enumerate(tensors[1:], 1):
        if t.shape != tensors[0].shape:
            raise ValueError(f"reduce_add: tensors[{i}] has shape {tuple(t.shape)} but tensors[0] has "
                             f"{tuple(tensors[0].shape)}; reduce_add sums same-shaped tensors")
    return _ReduceAdd.apply(dev, *tensors)
