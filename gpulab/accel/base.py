"""Where a training step's device work runs: a real GPU, the simulated accelerator, or the host.

Labs 01 and 02 write one step function that runs unchanged on every machine. The step receives
its batch already on the device and asks an :class:`Accelerator` for the device work::

    accel = pick_accelerator()            # cuda:0 if torch sees a GPU, else a simulated one
    def step_fn(batch):
        inputs, targets = batch           # already on accel.torch_device (profile_loop copied it)
        loss = accel.compute(0.020, inputs)   # 20 ms of device work, queued asynchronously
        return loss                       # loss.item() here would be a host-device sync

Three implementations, one interface:

- :class:`~gpulab.accel.cuda.CudaAccelerator` queues a real kernel (``torch.cuda._sleep``, one
  thread block that spins for a calibrated number of cycles) and times it with CUDA events. NVML's GPU-Util reads
  100 % while it runs although it occupies one SM: lab 01 uses exactly that.
- :class:`~gpulab.accel.sim.SimAccelerator` books the cost on a :class:`gpulab.accel.clock.SimulatedAccelerator` (a clock,
  nothing is computed on it). Its ``compute`` returns a :class:`DeviceValue` whose ``.item()``
  waits for the simulated device, so a sync costs what it costs on a GPU. Copies are charged by
  bytes over a stated bandwidth and follow CUDA's rules (a blocking copy first waits for the
  queue; only pinned memory copies asynchronously).
- :class:`~gpulab.accel.host.HostAccelerator` is "the CPU is the device": work runs synchronously on the host.

Every figure produced through a :class:`SimAccelerator` is labelled simulated by whoever reports it.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["Accelerator", "spin", "wait_until"]


def spin(seconds: float) -> None:
    """Keep one CPU core busy for ``seconds`` of wall-clock time (real CPU use, unlike sleep)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def wait_until(deadline: float) -> float:
    """Block the host until ``time.perf_counter() >= deadline``; returns the seconds waited.

    Sleeps until 2 ms before the deadline, then spins: a sleeper on a busy machine wakes up
    milliseconds late, and every late wake-up would leave the simulated device idle (a CUDA
    synchronisation wakes up within microseconds).
    """
    t0 = time.perf_counter()
    if deadline - t0 > 0.002:
        time.sleep(deadline - t0 - 0.002)
    while time.perf_counter() < deadline:
        pass
    return max(0.0, time.perf_counter() - t0)


class Accelerator:
    """The interface :func:`gpulab.profiling.profile_loop` and step functions use.

    Attributes:
        kind: ``"cuda"``, ``"simulated"`` or ``"host"``.
        name: for reports, e.g. ``"cuda:0 (NVIDIA H100)"`` or ``"sim:0 (simulated)"``.
        torch_device: where tensors go (``cpu`` for the simulated and host kinds).
    """

    kind = "abstract"
    name = "?"
    torch_device = torch.device("cpu")

    def compute(self, seconds: float, inputs: torch.Tensor | None = None) -> Any:
        """Queue ``seconds`` of device work and return a scalar "loss" (``inputs.mean()`` or 0)."""
        raise NotImplementedError

    def copy(self, batch: Any, non_blocking: bool = False) -> Any:
        """Move a nested batch to the device, as ``tensor.to(device, non_blocking=...)`` does."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait on the host until all queued device work is done."""
        raise NotImplementedError

    def begin(self) -> None:
        """Drain the queue and start a timing window (called by ``profile_loop``)."""
        self.synchronize()

    def record(self) -> Any:
        """An event at the current end of the device queue."""
        raise NotImplementedError

    def event_time(self, event: Any) -> float:
        """When the device reached ``event``, in ``time.perf_counter()`` seconds (after a sync)."""
        raise NotImplementedError

    def busy_between(self, start: Any, end: Any) -> float:
        """Seconds of compute the device did between two events (default: their distance)."""
        return max(0.0, self.event_time(end) - self.event_time(start))

    def copy_between(self, start: Any, end: Any) -> float:
        """Seconds of copying the device did between two events (default: their distance)."""
        return max(0.0, self.event_time(end) - self.event_time(start))

    def waited(self) -> float | None:
        """Total seconds the host spent blocked on this device, if it can count them exactly."""
        return None

    @property
    def simulated(self) -> bool:
        return self.kind == "simulated"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
