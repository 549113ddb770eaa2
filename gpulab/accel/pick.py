"""Choosing the accelerator a lab runs on: a real GPU when torch sees one, else a simulated one."""

from __future__ import annotations

from typing import Any

import torch

from gpulab.accel.base import Accelerator
from gpulab.accel.clock import SimulatedAccelerator
from gpulab.accel.cuda import CudaAccelerator
from gpulab.accel.host import HostAccelerator
from gpulab.accel.sim import SimAccelerator
from gpulab.devices.physical import cuda_device_count

__all__ = ["pick_accelerator", "as_accelerator"]


def pick_accelerator(prefer: str = "auto") -> Accelerator:
    """The accelerator labs use: ``cuda:0`` when torch sees a GPU, else a simulated one.

    Args:
        prefer: ``"auto"``, ``"cuda"`` (or ``"cuda:i"``), ``"sim"`` or ``"cpu"`` (the host clock).
    """
    if prefer == "auto":
        return CudaAccelerator("cuda:0") if cuda_device_count() else SimAccelerator()  # fork-safe count
    if prefer in ("sim", "simulated"):
        return SimAccelerator()
    if prefer == "cpu":
        return HostAccelerator()
    if prefer.startswith("cuda"):
        return CudaAccelerator(prefer)
    raise ValueError(f"unknown accelerator {prefer!r}; use 'auto', 'cuda', 'cuda:i', 'sim' or 'cpu'")


def as_accelerator(device: Any) -> Accelerator:
    """Accept an :class:`Accelerator`, a :class:`SimulatedAccelerator`, a ``torch.device``, a
    string (see :func:`pick_accelerator`) or None (``"auto"``)."""
    if isinstance(device, Accelerator):
        return device
    if isinstance(device, SimulatedAccelerator):
        return SimAccelerator(device)
    if device is None:
        return pick_accelerator()
    if isinstance(device, torch.device):
            return HostAccelerator() if device.type == "cpu" else CudaAccelerator(device)
    if isinstance(device, str):
        return pick_accelerator(device)
    raise TypeError(f"device must be an Accelerator, SimulatedAccelerator, torch.device or str, got {type(device).__name__}")
