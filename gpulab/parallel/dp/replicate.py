"""Replicate a module onto several logical devices: one module object per device, whose
parameters are differentiable copies of the original's, so gradients flow back to it.

This is ``torch/nn/parallel/replicate.py`` rebuilt on :mod:`gpulab.parallel.comm`:

- every submodule is copied *shallowly* (a new object sharing the original's attributes, with
  its own ``_parameters`` / ``_buffers`` / ``_modules`` dicts, as torch's
  ``Module._replicate_for_data_parallel`` does);
- each parameter is broadcast with ``comm.broadcast``: device ``i`` gets a copy whose backward
  sends the gradient home, so after ``loss.backward()`` the original's ``.grad`` holds the sum
  over replicas (torch's Broadcast / ReduceAddCoalesced pair). Replica 0, on the original's device,
  uses the original parameters themselves;
- buffers follow torch's semantics: buffers that do not require grad are broadcast *detached*,
  and replica 0 shares the original's buffers. So BatchNorm's running statistics are updated by
  replica 0 only (from its piece of the batch); the other replicas update copies that are dropped.

Why separate module objects? The tempting shortcut, one shared module run with
``torch.func.functional_call(module, replica_params, x)`` in several threads, races: it swaps the
parameters into the shared module in place, so thread 2 can run with thread 3's weights.

Example::

    replicas = replicate(model, devices)              # replicas[i] lives on devices[i]
    outs = [r(x) for r, x in zip(replicas, scatter(batch, devices))]
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import torch
from torch import nn

from gpulab.devices import LogicalDevice, placement
from gpulab.devices.validate import check_devices
from gpulab.parallel import comm

__all__ = ["replicate", "check_module_on"]

M = TypeVar("M", bound=nn.Module)


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing ``module``'s attributes (training flag, hyper-parameters),
    with its own registries to fill in (torch's ``_replicate_for_data_parallel``)."""
    replica = module.__new__(type(module))
    replica.__dict__ = module.__dict__.copy()
    replica._parameters = {}  # parameters become plain attributes: non-leaf copies, not Parameters
    replica._buffers = dict(module._buffers)
    replica._modules = dict(module._modules)
    replica._is_replica = True  # torch's flag: zero_grad() on a replica warns that it does nothing
    return replica


def check_module_on(module: nn.Module, device: LogicalDevice) -> None:
    """Raise ValueError unless every parameter and buffer of ``module`` lives on ``device``."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if t.device != device.physical or placement(t) != device:
            raise ValueError(f"{name} is on {placement(t)!r} but DataParallel replicates from devices[0] = "
                             f"{device!r}: move the model there first, e.g. gpulab.parallel.comm.to(model, devices[0])")


def replicate(module: M, devices: Sequence[LogicalDevice]) -> list[M]:
    """One replica of ``module`` per device, parameters broadcast differentiably.

    Args:
        module: the original; its parameters and buffers must live on ``devices[0]`` (where a
            model built on the first GPU, or on the CPU, is: see :func:`gpulab.devices.placement`).
        devices: the logical devices, one replica each.

    Returns:
        ``[replica_0, replica_1, ...]``; replica ``i`` computes on ``devices[i]``. Under
        ``torch.no_grad()`` the copies are not recorded by autograd (inference).

    Raises:
        TypeError: if ``devices`` are not LogicalDevices.
        ValueError: if a parameter or buffer is not on ``devices[0]``.

    Warning:
        In-place updates of buffers in ``forward`` are kept only from replica 0 (it shares the
        original's buffers); the other replicas update copies. BatchNorm's running statistics
        therefore come from the first piece of each batch, as with ``torch.nn.DataParallel``.
    """
    devices = check_devices(devices)
    check_module_on(module, devices[0])
    modules = list(module.modules())  # each submodule once, even if shared
    params = list(module.parameters())  # tied weights appear once: one broadcast each
    buffers = list(module.buffers())

    # copies[p][j]: parameter p on device j. Device 0 gets the parameter itself (comm's rule).
    param_copies = {id(p): comm.broadcast(p, devices) for p in params}
    buffer_copies = {}
    for b in buffers:
        if b.requires_grad:
            buffer_copies[id(b)] = comm.broadcast(b, devices)
        else:
            with torch.no_grad():  # detached, like torch: a replica's update never reaches autograd
                buffer_copies[id(b)] = comm.broadcast(b, devices)

    replicas = [{id(m): _shallow_copy(m) for m in modules} for _ in devices]
    for j, copies in enumerate(replicas):
        for m in modules:
            r = copies[id(m)]
            for key, child in m._modules.items():
                r._modules[key] = None if child is None else copies[id(child)]
            for key, p in m._parameters.items():
                # A plain attribute: found by normal lookup before nn.Module.__getattr__ runs.
                r.__dict__[key] = None if p is None else param_copies[id(p)][j]
            for key, b in m._buffers.items():
                r._buffers[key] = None if b is None else buffer_copies[id(b)][j]
    return [copies[id(module)] for copies in replicas]
