"""Where a training step's device work runs: a real GPU, the simulated accelerator, or the host.

Labs 01 and 02 write one step function that runs unchanged on every machine. The step receives
its batch already on the device and asks an :class:`Accelerator` for the device work::

    accel = pick_accelerator()            # cuda:0 if torch sees a GPU, else a simulated one
    def step_fn(batch):
        inputs, targets = batch           # already on accel.torch_device (profile_loop copied it)
        loss = accel.compute(0.020, inputs)   # 20 ms of device work, queued asynchronously
        return loss                       # loss.item() here would be a host-device sync

Three implementations, one interface:

- :class:`~gpulab.accel_cuda.CudaAccelerator` queues a real kernel (``torch.cuda._sleep``, one
  thread block that spins for a calibrated number of cycles) and times it with CUDA events. NVML's GPU-Util reads
  100 % while it runs although it occupies one SM: lab 01 uses exactly that.
- :class:`SimAccelerator` books the cost on a :class:`gpulab.sim.SimulatedAccelerator` (a clock,
  nothing is computed on it). Its ``compute`` returns a :class:`DeviceValue` whose ``.item()``
  waits for the simulated device, so a sync costs what it costs on a GPU. Copies are charged by
  bytes over a stated bandwidth and follow CUDA's rules (a blocking copy first waits for the
  queue; only pinned memory copies asynchronously).
- :class:`HostAccelerator` is "the CPU is the device": work runs synchronously on the host.

Every figure produced through a :class:`SimAccelerator` is labelled simulated by whoever reports it.
"""

from __future__ import annotations

import bisect
import time
from typing import Any, Callable

import torch

from gpulab.batches import tree_nbytes, tree_tensors
from gpulab.sim import SimEvent, SimulatedAccelerator

__all__ = ["Accelerator", "SimAccelerator", "HostAccelerator", "DeviceValue", "pick_accelerator", "as_accelerator",
           "spin", "wait_until"]


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


class HostAccelerator(Accelerator):
    """The CPU as the device: work runs synchronously on the host, nothing overlaps."""

    kind = "host"
    name = "cpu (host)"

    def compute(self, seconds: float, inputs: torch.Tensor | None = None) -> torch.Tensor:
        spin(seconds)
        return inputs.float().mean() if isinstance(inputs, torch.Tensor) else torch.zeros(())

    def copy(self, batch: Any, non_blocking: bool = False) -> Any:
        return batch  # already where the work runs

    def synchronize(self) -> None:
        pass

    def record(self) -> float:
        return time.perf_counter()

    def event_time(self, event: float) -> float:
        return event

    def waited(self) -> float:
        return 0.0


def _sample_mean(inputs: torch.Tensor | None) -> torch.Tensor:
    if not isinstance(inputs, torch.Tensor):
        return torch.zeros(())
    flat = inputs.detach().reshape(-1)
    return flat[:: max(1, flat.numel() // 4096)].float().mean()


def pick_accelerator(prefer: str = "auto") -> Accelerator:
    """The accelerator labs use: ``cuda:0`` when torch sees a GPU, else a simulated one.

    Args:
        prefer: ``"auto"``, ``"cuda"`` (or ``"cuda:i"``), ``"sim"`` or ``"cpu"`` (the host clock).
    """
    from gpulab.accel_cuda import CudaAccelerator

    if prefer == "auto":
        return CudaAccelerator("cuda:0") if torch.cuda.is_available() else SimAccelerator()
    if prefer in ("sim", "simulated"):
        return SimAccelerator()
    if prefer == "cpu":
        return HostAccelerator()
    if prefer.startswith("cuda"):
        return CudaAccelerator(prefer)
    raise ValueError(f"unknown accelerator {prefer!r}; use 'auto', 'cuda', 'cuda:i', 'sim' or 'cpu'")


def as_accelerator(device: Any) -> Accelerator:
    """Accept an :class:`Accelerator`, a :class:`SimulatedAccelerator`, a ``torch.device``, a
    string (see :func:`pick_accelerator`) or None (``"auto"``)."""
    if isinstance(device, Accelerator):
        return device
    if isinstance(device, SimulatedAccelerator):
        return SimAccelerator(device)
    if device is None:
        return pick_accelerator()
    if isinstance(device, torch.device):
        from gpulab.accel_cuda import CudaAccelerator

        return HostAccelerator() if device.type == "cpu" else CudaAccelerator(device)
    if isinstance(device, str):
        return pick_accelerator(device)
    raise TypeError(f"device must be an Accelerator, SimulatedAccelerator, torch.device or str, got {type(device).__name__}")
