"""Devices: what this machine has, and where each rank or replica runs.

- :mod:`~gpulab.devices.physical`: the real devices (:func:`cuda_device_count`, fork-safe;
  :func:`physical_devices`, :func:`default_device`).
- :mod:`~gpulab.devices.machine`: :class:`MachineSpec` and the backend and placement rules
  (:func:`choose_backend`, :func:`place_ranks`; lab 00).
- :mod:`~gpulab.devices.logical`: *logical devices* for multi-device lessons on any machine
  (:func:`logical_devices`, :class:`LogicalDevice`, :func:`current_device`).
- :mod:`~gpulab.devices.registry`: which logical device each storage lives on
  (:func:`placement`).
- :mod:`~gpulab.devices.meter`: :class:`MemoryMeter`, live and peak bytes per logical device and
  a budget that raises ``torch.OutOfMemoryError`` (labs 04, 05, 07, 08); its pieces are
  ``meter_attribution`` (which storages an op made, and where), ``meter_ledger`` (the counts),
  ``meter_threads`` (following worker threads) and ``meter_report`` (its report, ``format_bytes``).
- :mod:`~gpulab.devices.batches`: walking nested batches (tuples, lists, dicts of tensors).
- :mod:`~gpulab.devices.doctor`: ``python -m gpulab doctor``.
"""

from gpulab.devices.logical import (
    LogicalDevice,
    LogicalDevices,
    current_device,
    logical_devices,
)
from gpulab.devices.machine import MachineSpec, choose_backend, place_ranks
from gpulab.devices.meter import MemoryMeter
from gpulab.devices.meter_report import DeviceMemory, MemoryReport, format_bytes
from gpulab.devices.physical import (
    cuda_device_count,
    default_device,
    physical_devices,
)
from gpulab.devices.registry import placement

__all__ = [
    "cuda_device_count", "physical_devices", "default_device",
    "MachineSpec", "choose_backend", "place_ranks",
    "LogicalDevice", "LogicalDevices", "logical_devices", "current_device", "placement",
    "MemoryMeter", "MemoryReport", "DeviceMemory", "format_bytes",
]
