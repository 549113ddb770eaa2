"""Lab 08's graders: the references the out-of-memory exercises must not call."""

from __future__ import annotations

from gpulab.memory import batch_size
from gpulab.memory.loops import evaluate, train_epoch
from gpulab.memory.savings import bf16_step, checkpointed_forward, checkpointed_step, fp32_step

__all__ = ["REFERENCES"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
REFERENCES: tuple = (train_epoch, evaluate, batch_size.find_max_batch_size,
              batch_size._try,  # the search's inner step: a copy of the loop around it is caught too
              fp32_step, bf16_step, checkpointed_forward, checkpointed_step)
