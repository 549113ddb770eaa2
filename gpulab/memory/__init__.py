"""Memory on every logical device: measure it, budget it, and (lab 08) find what fills it.

- :class:`MemoryMeter` (:mod:`gpulab.memory.meter`): live and peak bytes per logical device, a
  budget that raises ``torch.OutOfMemoryError``, a table and plots.
- :mod:`gpulab.memory.report`: the report it returns, and byte formatting.

How it works: :mod:`gpulab.memory.attribution` (which storages an op created, and where they go),
:mod:`gpulab.memory.ledger` (the counts), :mod:`gpulab.memory.threads` (following worker threads).
"""

from gpulab.memory.meter import MemoryMeter
from gpulab.memory.report import DeviceMemory, MemoryReport, format_bytes

__all__ = ["MemoryMeter", "MemoryReport", "DeviceMemory", "format_bytes"]
