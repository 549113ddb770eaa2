"""Mixed precision with torch.amp, for DDP ranks and single devices alike (lab 06).

NVIDIA Apex (``apex.amp``, ``apex.parallel.DistributedDataParallel``) is how 2019-era code got
mixed precision and a DDP that tolerated some models; both are deprecated. Today the same job is
``torch.autocast`` + ``torch.amp.GradScaler`` + ``torch.nn.parallel.DistributedDataParallel``
(with ``find_unused_parameters=True`` for models with branches that some steps skip).

- On a GPU, autocast runs matmuls and convolutions in float16, and the GradScaler multiplies the
  loss before backward so small float16 gradients do not flush to zero, then un-scales them (and
  skips the step if any overflowed).
- On a CPU, autocast uses bfloat16: it has float32's exponent range, so gradients do not
  underflow and no scaler is needed (the scaler is created disabled and is a no-op).

Parameters and optimizer state stay float32 throughout; only the forward's compute is cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

__all__ = ["AmpSettings", "amp_settings", "make_grad_scaler", "amp_step"]


@dataclass(frozen=True)
class AmpSettings:
    """How to run mixed precision on one device type."""

    device_type: str
    dtype: torch.dtype
    use_scaler: bool


def amp_settings(device: torch.device | str) -> AmpSettings:
    """float16 + GradScaler on CUDA, bfloat16 without a scaler elsewhere (the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        return AmpSettings("cuda", torch.float16, True)
    return AmpSettings(device.type, torch.bfloat16, False)


def make_grad_scaler(device: torch.device | str) -> torch.amp.GradScaler:
    """A GradScaler that is enabled only where :func:`amp_settings` asks for one."""
    s = amp_settings(device)
    return torch.amp.GradScaler(s.device_type, enabled=s.use_scaler)


def amp_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable,
             optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, device: torch.device | str) -> torch.Tensor:
    """One mixed-precision training step; returns the (detached, float32) loss.

    The loss is computed inside autocast, ``scaler.scale(loss).backward()`` runs outside it (the
    backward ops follow the forward's dtypes by themselves), then ``scaler.step`` and
    ``scaler.update`` replace ``optimizer.step()``. With a DDP model the gradient all-reduce
    happens during that backward, on the (un-scaled later) float32 gradients.
    """
    s = amp_settings(device)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=s.device_type, dtype=s.dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach().float()
