"""Measuring gradient synchronisation (lab 06): what DDP's strategies cost, seen from outside them.

- ``timing``: seconds per training step of each strategy (naive, overlapped, bucketed, torch
  DDP), interleaved in one launch (:func:`time_sync_strategies`);
- ``trace``: when each all-reduce starts against the gradients backward produces;
- ``ring_cost``: the α–β cost of a ring all-reduce, fitted to measured times, and the bucket size
  it predicts (the algorithm it measures is in :mod:`gpulab.parallel.ddp`).
"""

from gpulab.parallel.measure.timing import StepTimingConfig, summarize_step_times, time_sync_strategies

__all__ = ["StepTimingConfig", "summarize_step_times", "time_sync_strategies"]
