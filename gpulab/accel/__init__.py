"""Where a training step's device work runs: a real GPU, the simulated accelerator, or the host.

One interface (:class:`Accelerator`, in :mod:`~gpulab.accel.base`), three implementations:

- :mod:`~gpulab.accel.cuda`: a real GPU, timed with CUDA events;
- :mod:`~gpulab.accel.sim`: the simulated device of CPU-only machines, booked on the clock in
  :mod:`~gpulab.accel.clock`;
- :mod:`~gpulab.accel.host`: the CPU as the device, synchronous.

:func:`pick_accelerator` (:mod:`~gpulab.accel.pick`) chooses one for the machine.
"""

from gpulab.accel.base import Accelerator, StepMarks, spin, wait_until
from gpulab.accel.clock import SimEvent, SimulatedAccelerator
from gpulab.accel.cuda import CudaAccelerator
from gpulab.accel.host import HostAccelerator
from gpulab.accel.pick import as_accelerator, pick_accelerator
from gpulab.accel.sim import DeviceValue, SimAccelerator

__all__ = ["Accelerator", "StepMarks", "SimAccelerator", "HostAccelerator", "CudaAccelerator", "DeviceValue", "SimulatedAccelerator",
           "SimEvent", "pick_accelerator", "as_accelerator", "spin", "wait_until"]
