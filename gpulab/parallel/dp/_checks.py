"""Argument checks shared by DataParallel, its pieces and the balanced criterion: one wording for
the mistakes people make most (``device_ids=[0, 1]`` or ``"cuda:1"`` where gpulab wants logical
devices)."""

from __future__ import annotations

from typing import Any

import torch

from gpulab.devices.logical import LogicalDevice
from gpulab.parallel import comm

__all__ = ["check_devices", "check_device"]


def _hint(n: int) -> str:
    return (f"make them with devices = gpulab.devices.logical_devices({max(n, 1)}), which maps them onto "
            "the GPUs this machine has (or shares one device, and says so)")


def check_devices(devices: Any, what: str = "devices") -> list[LogicalDevice]:
    """``devices`` as a list of distinct LogicalDevices, or a TypeError/ValueError naming the fix."""
    if isinstance(devices, (str, int, torch.device, LogicalDevice)):
        raise TypeError(f"{what} must be a list of LogicalDevice, got {devices!r}: {_hint(1)}")
    try:
        items = list(devices)
    except TypeError:
        raise TypeError(f"{what} must be a list of LogicalDevice, got {type(devices).__name__}: {_hint(1)}") from None
    if not items:
        raise ValueError(f"{what} is empty: {_hint(1)}")
    for i, d in enumerate(items):
        if not isinstance(d, LogicalDevice):
            raise TypeError(f"{what}[{i}] is {d!r} ({type(d).__name__}), not a LogicalDevice: "
                            f"device names and ids are not accepted; {_hint(len(items))}")
    return comm._check_devices(items, what)


def check_device(device: Any, what: str = "device") -> LogicalDevice:
    """One LogicalDevice, or a TypeError naming the fix."""
    if not isinstance(device, LogicalDevice):
        raise TypeError(f"{what} is {device!r} ({type(device).__name__}), not a LogicalDevice: pass one of "
                        "the devices from gpulab.devices.logical_devices(n), e.g. devices[1]")
    return comm._check_device(device, what)
