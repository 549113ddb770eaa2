"""Where a training loop's time goes (lab 01): ``profile_loop`` and ``python -m gpulab profile``.

- :mod:`~gpulab.profiling.loop`: :func:`profile_loop`, which times data wait, copy and compute per step.
- :mod:`~gpulab.profiling.result`: :class:`LoopProfile`, what it measured; :mod:`~gpulab.profiling.view`
  draws it.
- :mod:`~gpulab.profiling.bottleneck`: the verdicts (data-, copy-, sync- or compute-bound).
- :mod:`~gpulab.profiling.workloads`: the demo loop the command line profiles.
- :mod:`~gpulab.profiling.torch_trace`: :class:`TorchTrace`, the same loop recorded by torch.profiler
  (``profile_loop(..., trace=TorchTrace("loop.json"))``), and readers of its ``key_averages()``.
- :mod:`~gpulab.profiling.phases`: torch.profiler on one's own loop, with ranges of its own, and a
  :class:`~gpulab.profiling.phases.Stopwatch` that times the same run without any profiler range.
"""

from gpulab.profiling.loop import profile_loop
from gpulab.profiling.result import LoopProfile
from gpulab.profiling.torch_trace import TorchTrace

__all__ = ["profile_loop", "LoopProfile", "TorchTrace"]
