"""The one check that an argument is a usable :class:`LogicalDevice` (or a list of them).

Every multi-device function in gpulab (the transfers in :mod:`gpulab.parallel.comm`, DataParallel
and its pieces, the model split, :class:`gpulab.devices.MemoryMeter`) checks its ``device`` /
``devices`` argument here, so the most common mistakes get one wording that names the fix:

- ``device_ids=[0, 1]`` or ``"cuda:1"`` where gpulab wants logical devices (a TypeError);
- a logical device on a GPU this machine does not have, e.g. made on a bigger server (ValueError);
- a device that the active :class:`~gpulab.devices.MemoryMeter` does not measure (ValueError);
- an empty list, or a device listed twice (ValueError).
"""

from __future__ import annotations

from typing import Any

import torch

from gpulab.devices.logical import LogicalDevice
from gpulab.devices.physical import cuda_device_count
from gpulab.devices.registry import check_in_scope

__all__ = ["check_device", "check_devices"]


def _hint(n: int) -> str:
    return (f"make them with devices = gpulab.devices.logical_devices({max(n, 1)}), which maps them onto "
            "the GPUs this machine has (or shares one device, and says so)")


def _check_type(device: Any, what: str, hint: str) -> LogicalDevice:
    if not isinstance(device, LogicalDevice):
        raise TypeError(f"{what} is {device!r} ({type(device).__name__}), not a LogicalDevice: {hint}")
    return device


def _check_usable(device: LogicalDevice) -> None:
    phys = device.physical
    if phys.type == "cuda" and (phys.index or 0) >= cuda_device_count():
        raise ValueError(f"{device!r} is on {phys}, which this machine does not have ({cuda_device_count()} GPUs): "
                         "take the devices from logical_devices(n), which maps them onto the devices that exist")
    if phys.type not in ("cpu", "cuda"):
        raise ValueError(f"{device!r} is on {phys}: gpulab moves tensors between cpu and cuda devices only")
    check_in_scope(device)


def check_device(device: Any, what: str = "device", *, usable: bool = True) -> LogicalDevice:
    """``device`` itself if it is a LogicalDevice that tensors can be sent to.

    Args:
        device: the argument to check.
        what: its name in the error message (``"output_device"``, ``"devices[2]"``).
        usable: also check that its physical device exists here and that an active MemoryMeter
            measures it (False: the type alone, e.g. for the devices a meter is created with).

    Raises:
        TypeError: if ``device`` is not a LogicalDevice (a GPU id, ``"cuda:1"``, a torch.device).
        ValueError: if it is not usable (see ``usable``).
    """
    _check_type(device, what, "pass one of the devices from gpulab.devices.logical_devices(n), e.g. devices[1]")
    if usable:
        _check_usable(device)
    return device


def check_devices(devices: Any, what: str = "devices", *, usable: bool = True,
                  repeats: bool = False) -> list[LogicalDevice]:
    """``devices`` as a list of distinct LogicalDevices (see :func:`check_device` for ``usable``;
    ``repeats=True`` lets a device appear more than once, as interleaved pipeline stages do).

    Raises:
        TypeError: if ``devices`` is one device, a name or an id instead of a list, or lists
            something that is not a LogicalDevice.
        ValueError: if it is empty, lists a device twice (unless ``repeats``), or a device is not usable.
    """
    if isinstance(devices, (str, int, torch.device, LogicalDevice)):
        raise TypeError(f"{what} must be a list of LogicalDevice, got {devices!r}: {_hint(1)}")
    try:
        items = list(devices)
    except TypeError:
        raise TypeError(f"{what} must be a list of LogicalDevice, got {type(devices).__name__}: {_hint(1)}") from None
    if not items:
        raise ValueError(f"{what} is empty: {_hint(1)}")
    for i, d in enumerate(items):
        _check_type(d, f"{what}[{i}]", f"device names and ids are not accepted; {_hint(len(items))}")
    seen: set[LogicalDevice] = set()
    for d in items:
        if d in seen:
            if repeats:
                continue
            raise ValueError(f"{what} lists {d} twice: each device gets one piece; list each once")
        seen.add(d)
        if usable:
            _check_usable(d)
    return items
