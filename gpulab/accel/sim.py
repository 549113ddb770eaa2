"""The simulated accelerator behind the :class:`~gpulab.accel.base.Accelerator` interface.

Work is booked on a :class:`gpulab.accel.clock.SimulatedAccelerator` (a clock; nothing is
computed there), and a :class:`DeviceValue` stands for a result the device is still computing,
so that reading it costs a host-device synchronisation as ``loss.item()`` does on a GPU.
"""

from __future__ import annotations

import bisect
import time
from typing import Any, Callable, Sequence

import torch

from gpulab.accel.base import Accelerator, StepMarks, wait_until
from gpulab.accel.clock import SimEvent, SimulatedAccelerator
from gpulab.devices.batches import tree_nbytes, tree_tensors

__all__ = ["SimAccelerator", "DeviceValue"]


class DeviceValue:
    """A scalar that the simulated device is still computing.

    Reading it (``.item()``, ``float()``, printing) waits until the device reaches the work that
    produces it: a host-device synchronisation, as ``loss.item()`` is on a GPU. Adding values
    does not wait, so ``total = total + loss`` keeps the loop asynchronous.
    """

    def __init__(self, value: torch.Tensor, ready: SimEvent, on_wait: Callable[[float], None] | None = None):
        self.value = value
        self.ready = ready
        self._on_wait = on_wait

    def item(self) -> float:
        """The value as a Python float, after waiting for the device (a sync point)."""
        waited = wait_until(self.ready.time)
        if self._on_wait is not None:
            self._on_wait(waited)
        return float(self.value)

    __float__ = item

    def detach(self) -> "DeviceValue":
        return self

    def _combine(self, other: Any, op: Callable[[Any, Any], Any]) -> "DeviceValue":
        if isinstance(other, DeviceValue):  # ready when both are: the later event
            ready = other.ready if other.ready.time > self.ready.time else self.ready
            return DeviceValue(op(self.value, other.value), ready, self._on_wait)
        return DeviceValue(op(self.value, other), self.ready, self._on_wait)

    def __add__(self, other: Any) -> "DeviceValue":
        return self._combine(other, lambda a, b: a + b)

    __radd__ = __add__

    def __mul__(self, other: Any) -> "DeviceValue":
        return self._combine(other, lambda a, b: a * b)

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> "DeviceValue":
        return self._combine(other, lambda a, b: a / b)

    def __repr__(self) -> str:
        return f"DeviceValue({self.item():.6g})"  # like printing a CUDA tensor: this syncs


class SimAccelerator(Accelerator):
    """The simulated accelerator behind the :class:`Accelerator` interface (CPU-only machines).

    Args:
        sim: the clock to book work on (a new :class:`SimulatedAccelerator` if omitted).
        h2d_gb_per_s: simulated host-to-device bandwidth in GB/s. A PCIe 4.0 x16 link moves about
            25 GB/s from pinned memory; the default is lower so that a lab-sized batch takes a
            visible share of a step, as a full-size image batch does on real hardware.

    Warning:
        Tensors stay in CPU memory. On a CPU-only build ``tensor.is_pinned()`` is always False
        (pinning needs a CUDA driver), so every simulated copy is a pageable one: ``non_blocking``
        cannot make it asynchronous, exactly as on a GPU machine without ``pin_memory=True``.
    """

    kind = "simulated"

    def __init__(self, sim: SimulatedAccelerator | None = None, h2d_gb_per_s: float = 2.0) -> None:
        if h2d_gb_per_s <= 0:
            raise ValueError(f"h2d_gb_per_s must be positive, got {h2d_gb_per_s!r}")
        self.sim = sim if sim is not None else SimulatedAccelerator()
        self.h2d_bytes_per_s = h2d_gb_per_s * 1e9
        self.name = f"{self.sim.name} (simulated)"
        # compute intervals (perf_counter seconds), copies excluded; ends ascend (one queue)
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._copy_ends: list[float] = []  # copies: end times and the running total of their cost
        self._copy_total: list[float] = []
        self._waited = 0.0

    def _count_wait(self, seconds: float) -> None:
        self._waited += seconds

    def compute(self, seconds: float, inputs: torch.Tensor | None = None) -> DeviceValue:
        ev = self.sim.submit(seconds)
        self._starts.append(ev.time - seconds / self.sim.speed)
        self._ends.append(ev.time)
        # the value is computed now on the host but only readable once the device is there; a
        # strided sample of <= 4096 elements keeps it tiny and single-threaded (a torch op that
        # fans out to intra-op threads stalls for milliseconds when the other cores are busy)
        value = _sample_mean(inputs)
        return DeviceValue(value, ev, self._count_wait)

    def copy(self, batch: Any, non_blocking: bool = False) -> Any:
        cost = tree_nbytes(batch) / self.h2d_bytes_per_s
        pinned = [t.is_pinned() for t in tree_tensors(batch)]
        if non_blocking and pinned and all(pinned):
            self._book_copy(cost)  # DMA from pinned memory: queued, the host goes on
        elif non_blocking:
            self._book_copy(cost)  # pageable: the host stages the bytes itself, no queue wait
            self._waited += wait_until(time.perf_counter() + cost)
        else:
            self.synchronize()  # a blocking copy waits for the queue first
            self._book_copy(cost)
            self.synchronize()
        return batch

    def _book_copy(self, cost: float) -> None:
        ev = self.sim.submit(cost)
        self._copy_ends.append(ev.time)
        self._copy_total.append((self._copy_total[-1] if self._copy_total else 0.0) + cost / self.sim.speed)

    def copy_between(self, start: SimEvent, end: SimEvent) -> float:
        # exact: the copies that finished between the two events, not a late host wake-up
        lo = bisect.bisect_right(self._copy_ends, start.time)
        hi = bisect.bisect_right(self._copy_ends, end.time)
        if hi <= lo:
            return 0.0
        return self._copy_total[hi - 1] - (self._copy_total[lo - 1] if lo else 0.0)

    def synchronize(self) -> None:
        self._waited += wait_until(self.sim.record_event().time)

    def record(self) -> SimEvent:
        return self.sim.record_event()

    def event_time(self, event: SimEvent) -> float:
        return event.time

    def busy_between(self, start: SimEvent, end: SimEvent) -> float:
        # exact: only compute intervals count, not copies or idle gaps inside the step
        return sum(e - s for s, e in self.compute_intervals(start.time, end.time))

    def compute_intervals(self, lo: float, hi: float) -> list[tuple[float, float]]:
        """Compute intervals clipped to ``[lo, hi]`` (perf_counter), relative to ``lo``."""
        out, i = [], bisect.bisect_right(self._ends, lo)
        while i < len(self._ends) and self._starts[i] < hi:
            out.append((max(self._starts[i], lo) - lo, min(self._ends[i], hi) - lo))
            i += 1
        return out

    def waited(self) -> float:
        return self._waited

    def busy_intervals(self, steps: Sequence[StepMarks], t_start: float, t_end: float) -> list[tuple[float, float]]:
        # exact: only the booked compute intervals, so idle gaps inside a step do not count
        return self.compute_intervals(t_start, t_end)


def _sample_mean(inputs: torch.Tensor | None) -> torch.Tensor:
    """The mean of at most about 4096 evenly spaced elements of ``inputs`` (0 without inputs)."""
    if not isinstance(inputs, torch.Tensor):
        return torch.zeros(())
    flat = inputs.detach().reshape(-1)  # (numel,)
    stride = max(1, flat.numel() // 4096)
    return flat[::stride].float().mean()  # (numel / stride,) -> ()
