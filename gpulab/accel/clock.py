"""A simulated accelerator: an asynchronous device clock for CPU-only machines.

A real GPU runs kernels *asynchronously*: ``loss.backward()`` returns as soon as the work is
queued, the GPU stays busy for as long as the work takes, and the host is free to prepare the
next batch meanwhile. Only a synchronisation (``.item()``, ``torch.cuda.synchronize()``, a
copy to the host) makes the host wait.

On a machine with no GPU, :class:`SimulatedAccelerator` keeps that lesson honest: ``submit``
returns at once and books the device for ``cost_s`` seconds of wall-clock time after whatever
is already queued; ``synchronize`` sleeps until the queue drains. Busy intervals are recorded, so
``utilization()`` and :meth:`timeline` answer "how busy was the device?" the way NVML's
GPU-Util does for a real one. Nothing is computed on it: it is a clock, and every figure it
produces is labelled simulated by the code that reports it.

Example::

    acc = SimulatedAccelerator()
    for batch in loader:           # the host prepares the batch (real CPU work)
        acc.submit(0.020)          # the "GPU" computes for 20 ms, asynchronously
    acc.synchronize()
    print(acc.utilization())       # busy fraction since the accelerator was created or reset
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

__all__ = ["SimulatedAccelerator", "SimEvent"]


@dataclass(frozen=True)
class SimEvent:
    """A marker in the device queue, like a CUDA event: ``time`` is when the device reaches it."""

    time: float

    def query(self) -> bool:
        """True once the device has reached this event."""
        return time.perf_counter() >= self.time

    def synchronize(self) -> None:
        """Wait (on the host) until the device reaches this event."""
        delay = self.time - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    def elapsed_time(self, end: "SimEvent") -> float:
        """Seconds of device time from this event to ``end`` (CUDA's returns milliseconds)."""
        return end.time - self.time


class SimulatedAccelerator:
    """An asynchronous device clock (see the module docstring).

    Args:
        name: shown in reports, e.g. ``"sim:0"``.
        speed: work runs ``speed`` times faster than its nominal cost (2.0 halves every cost).

    Thread-safe: several host threads may submit to the same accelerator; work is queued in
    submission order, as on one CUDA stream.
    """

    def __init__(self, name: str = "sim:0", speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed!r}")
        self.name = name
        self.speed = speed
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget all work and start the utilisation window now (waits for nothing)."""
        with self._lock:
            self._t0 = time.perf_counter()
            self._free_at = self._t0
            self._intervals: list[tuple[float, float]] = []

    # -- the asynchronous interface ---------------------------------------------------------------

    def submit(self, cost_s: float) -> SimEvent:
        """Queue ``cost_s`` seconds of device work and return at once.

        Returns:
            An event the device reaches when this work is done.

        Raises:
            ValueError: for a negative or non-finite cost.
        """
        if not (cost_s >= 0 and cost_s != float("inf")):
            raise ValueError(f"cost_s must be a finite number of seconds >= 0, got {cost_s!r}")
        now = time.perf_counter()
        with self._lock:
            start = max(now, self._free_at)
            end = start + cost_s / self.speed
            if end > start:
                self._intervals.append((start, end))
            self._free_at = end
        return SimEvent(end)

    def record_event(self) -> SimEvent:
        """An event at the current end of the queue (like ``torch.cuda.Event.record()``)."""
        with self._lock:
            return SimEvent(max(time.perf_counter(), self._free_at))

    def synchronize(self) -> float:
        """Block the host until all queued work is done; returns the seconds spent waiting."""
        with self._lock:
            free_at = self._free_at
        delay = free_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
            return delay
        return 0.0

    def query(self) -> bool:
        """True when the queue is empty (the device is idle)."""
        with self._lock:
            return time.perf_counter() >= self._free_at

    # -- measurement ------------------------------------------------------------------------------

    def busy_time(self, start: float | None = None, end: float | None = None) -> float:
        """Seconds the device was busy between ``start`` and ``end`` (perf_counter times;
        default: since the last reset, up to now). Queued work in the future does not count."""
        now = time.perf_counter()
        with self._lock:
            lo = self._t0 if start is None else start
            hi = now if end is None else min(end, now)
            return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in self._intervals)

    def utilization(self, start: float | None = None, end: float | None = None) -> float:
        """Busy fraction of the window (0..1), the simulated counterpart of GPU-Util."""
        now = time.perf_counter()
        lo = self._t0 if start is None else start
        hi = now if end is None else min(end, now)
        if hi <= lo:
            return 0.0
        return self.busy_time(lo, hi) / (hi - lo)

    def timeline(self) -> list[tuple[float, float]]:
        """Busy intervals as (start, end) seconds relative to the last reset."""
        with self._lock:
            return [(s - self._t0, e - self._t0) for s, e in self._intervals]

    def __repr__(self) -> str:
        return f"SimulatedAccelerator({self.name!r}, speed={self.speed}, utilization={self.utilization():.2f})"
