"""Mixed precision with torch.amp, for DDP ranks and single devices alike (lab 06's reference).

``torch.autocast`` + ``torch.amp.GradScaler`` + torch DDP replace NVIDIA Apex (``apex.amp``,
deprecated). Which 16-bit type (:func:`amp_settings`):

- **bfloat16** has float32's 8-bit exponent: gradients do not underflow, **no loss scaling**.
  The default where the hardware computes it natively: CPUs, NVIDIA GPUs from Ampere on (8.0).
- **float16** has a 5-bit exponent (values below about 6e-8 flush to zero) and needs
  ``GradScaler``: the loss is scaled before backward, the gradients un-scaled before the step, and
  a step whose gradients overflowed is skipped. For Volta or Turing GPUs (no native bf16).

Parameters and optimizer state stay float32; only the forward's compute is cheaper
(PyTorch's "Automatic Mixed Precision package - torch.amp"). Used by lab 06; tests:
``pytest tests/parallel/test_amp.py``.
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


def amp_settings(device: torch.device | str, dtype: torch.dtype | None = None) -> AmpSettings:
    """The 16-bit type for ``device``, and whether it needs a GradScaler (only float16 does).

    Args:
        device: where the forward runs.
        dtype: force ``torch.bfloat16`` or ``torch.float16``; default: bfloat16 on a CPU and on a
            GPU of compute capability 8.0 or more (Ampere and newer), else float16.

    Warning:
        The default on a CUDA device reads its compute capability, which initialises CUDA in
        this process: call it inside a rank, not in a notebook that will fork ranks afterwards.
    """
    device = torch.device(device)
    if dtype is None:
        # bf16 in hardware on GPUs from Ampere on; a CPU without bf16 instructions converts to float32
        bf16 = device.type != "cuda" or torch.cuda.get_device_properties(device).major >= 8
        dtype = torch.bfloat16 if bf16 else torch.float16
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16 (mixed precision), got {dtype}")
    return AmpSettings(device.type, dtype, dtype == torch.float16)


def make_grad_scaler(device: torch.device | str, dtype: torch.dtype | None = None) -> torch.amp.GradScaler:
    """A GradScaler that is enabled only where :func:`amp_settings` asks for one (float16)."""
    s = amp_settings(device, dtype)
    return torch.amp.GradScaler(s.device_type, enabled=s.use_scaler)


def amp_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable,
             optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, device: torch.device | str,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """One mixed-precision training step; returns the (detached, float32) loss.

    The loss is computed inside autocast, ``scaler.scale(loss).backward()`` runs outside it (the
    backward ops follow the forward's dtypes by themselves), then ``scaler.step`` and
    ``scaler.update`` replace ``optimizer.step()``. With a DDP model the gradient all-reduce
    happens during that backward, on the (un-scaled later) float32 gradients. ``scaler`` must
    match the dtype: enabled for float16 (:func:`make_grad_scaler`).
    """
    s = amp_settings(device, dtype)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=s.device_type, dtype=s.dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach().float()
