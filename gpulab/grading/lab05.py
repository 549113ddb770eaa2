"""Lab 05's graders: the references the balanced-criterion exercises must not call."""

from __future__ import annotations

from gpulab.parallel.dp.balanced import DataParallelCriterion, DataParallelModel
from gpulab.parallel.dp.batch_scaling import scaled_lr, time_to_target
from gpulab.parallel.dp.step_memory import largest_batch

__all__ = ["REFERENCES"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
REFERENCES: tuple = (DataParallelCriterion, DataParallelModel, largest_batch, scaled_lr, time_to_target)
