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
from typing import Any, NamedTuple, Sequence

import torch

__all__ = ["Accelerator", "StepMarks", "spin", "wait_until"]


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


class StepMarks(NamedTuple):
    """The marks :func:`gpulab.profiling.profile_loop` takes during one step.

    Host times are ``time.perf_counter()`` seconds; events come from :meth:`Accelerator.record`
    (positions in the device's queue, read with :meth:`Accelerator.event_time`).
    """

    requested: float  # the host asks the loader for a batch
    received: float  # the batch arrived; the copy to the device starts
    copied: float  # ``accel.copy`` returned; ``step_fn`` starts
    returned: float  # ``step_fn`` returned
    waited_before: float | None  # ``accel.waited()`` before ``step_fn`` (None: it cannot count waits)
    waited_after: float | None  # ``accel.waited()`` after ``step_fn``
    copy_start: Any  # device event before the copy
    copy_end: Any  # device event after the copy: the step's device work is queued after it
    step_end: Any  # device event after the work ``step_fn`` queued

    @property
    def data_wait(self) -> float:
        """Host seconds waiting for the loader."""
        return self.received - self.requested

    @property
    def copy_host(self) -> float:
        """Host seconds inside ``accel.copy``."""
        return self.copied - self.received

    @property
    def in_step(self) -> float:
        """Host seconds inside ``step_fn``."""
        return self.returned - self.copied


class Accelerator:
    """The interface :func:`gpulab.profiling.profile_loop` and step functions use.

    Step functions call ``compute``; ``profile_loop`` calls ``copy``, ``record`` and
    ``synchronize`` during the loop, then asks the accelerator how to read each step's
    :class:`StepMarks` (``copy_seconds``, ``step_wait``, ``host_work``, ``busy_intervals``):
    what a mark means depends on whether the device keeps its own time (CUDA), is booked exactly
    (simulated), or is the host itself.

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

    # -- reading one profiled step (profile_loop): what each accelerator knows of its own time ----

    def copy_seconds(self, step: StepMarks) -> float:
        """Of the host's time in ``copy()``, the seconds the copy itself took. The rest of it was
        a blocking copy waiting for the queued work first: a sync."""
        return min(step.copy_host, self.copy_between(step.copy_start, step.copy_end))

    def step_wait(self, step: StepMarks) -> float:
        """Seconds the host was blocked on the device inside ``step_fn`` (``loss.item()``, a
        blocking copy): a sync. At most ``step.in_step``.

        An accelerator that counts its waits (:meth:`waited`) gives the exact figure. Without a
        count (CUDA) a wait is inferred when ``step_fn`` returned just as the device finished the
        step's work (within 1 ms): the time both spent on the step (the host inside ``step_fn``,
        the device on its work) is then the wait.
        """
        if step.waited_before is not None and step.waited_after is not None:
            return min(step.waited_after - step.waited_before, step.in_step)
        work_start, work_end = self.event_time(step.copy_end), self.event_time(step.step_end)
        if abs(step.returned - work_end) >= 1e-3:
            return 0.0  # step_fn returned before (or long after) the device finished: no sync seen
        return max(0.0, min(step.returned, work_end) - max(step.copied, work_start))

    def host_work(self, step: StepMarks) -> float:
        """Seconds of the host's own work inside ``step_fn``: its time there less the wait."""
        return step.in_step - self.step_wait(step)

    def busy_intervals(self, steps: Sequence[StepMarks], t_start: float, t_end: float) -> list[tuple[float, float]]:
        """The device's compute intervals in the window ``[t_start, t_end]``, relative to ``t_start``.

        This default gives one interval per step, from the end of its copy to the end of its work,
        so an idle gap inside a step counts as busy.
        """
        intervals = []
        for step in steps:
            start = self.event_time(step.copy_end) - t_start
            end = self.event_time(step.step_end) - t_start
            if end > start:
                intervals.append((start, end))
        return intervals

    @property
    def simulated(self) -> bool:
        return self.kind == "simulated"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
