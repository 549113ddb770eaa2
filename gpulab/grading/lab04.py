"""Lab 04's graders: the references the DataParallel exercises must not call."""

from __future__ import annotations

from gpulab.parallel import comm
from gpulab.parallel.dp.data_parallel import DataParallel
from gpulab.parallel.dp.parallel_apply import parallel_apply
from gpulab.parallel.dp.replicate import replicate
from gpulab.parallel.dp.scatter_gather import gather, scatter, scatter_kwargs
from gpulab.parallel.dp.step_memory import fits_in_budget, step_memory

__all__ = ["REFERENCES"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
REFERENCES: tuple = (comm.scatter, comm.gather, comm.broadcast, scatter, scatter_kwargs, gather, parallel_apply, replicate, DataParallel,
              step_memory, fits_in_budget)
