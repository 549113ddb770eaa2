"""Lab 01's graders: the references the bottleneck exercises must not call."""

from __future__ import annotations

from gpulab.accel.sim import DeviceValue
from gpulab.profiling.bottleneck import busy_fraction, classify, sm_activity, verdict
from gpulab.profiling.loop import profile_loop
from gpulab.profiling.torch_trace import TorchTrace, label_shares, top_ops

__all__ = ["REFERENCES"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
# profile_loop and TorchTrace record a loop with torch.profiler: exercise 5 writes that itself.
REFERENCES: tuple = (busy_fraction, sm_activity, classify, verdict, DeviceValue.item, DeviceValue.__repr__,
                     profile_loop, TorchTrace, top_ops, label_shares)
