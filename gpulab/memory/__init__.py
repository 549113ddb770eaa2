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
- :func:`oom_retry` (:mod:`~gpulab.memory.retry`): a step that splits the batch on out-of-memory.
- :func:`summary` (:mod:`~gpulab.memory.summary`): per-layer shapes, parameters, activation bytes.
- :mod:`~gpulab.memory.savings` (bf16 autocast, checkpointing, :func:`peak_memory`) and
  :mod:`~gpulab.memory.loops` (loops that keep memory flat): the lab's references.

PyTorch's own tools beside them, reading the same runs:

- :mod:`~gpulab.memory.profiled` (:class:`~gpulab.memory.profiled.MemoryProfile`): ``torch.profiler``
  with ``profile_memory=True``, one range per step: net bytes per step, the op table, a snapshot.
- :mod:`~gpulab.memory.snapshot`: the CUDA memory snapshot (``_record_memory_history``,
  ``_dump_snapshot``, pytorch.org/memory_viz) recorded and read: live blocks by the frames that
  allocated them, and the sites that grew between two snapshots.
"""

from gpulab.memory.batch_size import find_max_batch_size, free_memory
from gpulab.memory.cuda_report import MemoryStatus, memory_report
from gpulab.memory.leaks import LeakFinder, LeakReport
from gpulab.memory.retry import OOMRetry, oom_retry
from gpulab.memory.savings import peak_memory
from gpulab.memory.summary import ModelSummary, ShapeMismatchError, summary
from gpulab.memory.trend import LeakCriterion

__all__ = ["memory_report", "MemoryStatus", "LeakFinder", "LeakCriterion", "LeakReport", "find_max_batch_size",
           "free_memory", "oom_retry", "OOMRetry", "summary", "ModelSummary",
           "ShapeMismatchError", "peak_memory"]
