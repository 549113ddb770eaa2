"""Memory on every logical device: measure it, budget it, and (lab 08) find what fills it.

The meter itself, :class:`gpulab.devices.MemoryMeter`, lives with the devices it measures (labs
04, 05, 07 and 08 use it).

Lab 08's tools for out-of-memory errors:

- :func:`memory_report` (:mod:`~gpulab.memory.cuda_report`): the CUDA allocator's statistics on a
  GPU, a meter's otherwise.
- :class:`LeakFinder` (:mod:`~gpulab.memory.leaks`, :mod:`~gpulab.memory.origins`, :mod:`~gpulab.memory.trend`,
  :mod:`~gpulab.memory.leak_report`): live memory per step, a leak verdict, and the surviving
  tensors with the line that made them.
- :func:`find_max_batch_size` (:mod:`~gpulab.memory.batch_size`): binary search under a budget.
- :func:`summary` (:mod:`~gpulab.memory.summary`): per-layer shapes, parameters, activation bytes.
- The lab's references: :mod:`~gpulab.memory.fixes.loops` (loops that keep memory flat),
  :mod:`~gpulab.memory.fixes.retry` (a step that splits its batch through out-of-memory) and
  :mod:`~gpulab.memory.fixes.savings` (bf16 autocast, checkpointing, :func:`peak_memory`).

PyTorch's own tools beside them (``torch.profiler`` with ``profile_memory=True``, the CUDA memory
snapshot and pytorch.org/memory_viz) are called directly in lab 08's cells: gpulab does not wrap them.
"""

from gpulab.memory.batch_size import find_max_batch_size, free_memory
from gpulab.memory.cuda_report import MemoryStatus, memory_report
from gpulab.memory.fixes.savings import peak_memory
from gpulab.memory.leaks import LeakFinder, LeakReport
from gpulab.memory.summary import ModelSummary, ShapeMismatchError, summary
from gpulab.memory.trend import LeakCriterion

__all__ = ["memory_report", "MemoryStatus", "LeakFinder", "LeakCriterion", "LeakReport", "find_max_batch_size",
           "free_memory", "summary", "ModelSummary", "ShapeMismatchError", "peak_memory"]
