"""MemoryMeter: live and peak bytes per logical device, on any machine, with an optional budget.

``torch.cuda.memory_allocated`` reports nothing on a CPU, and one number for a GPU that several
logical devices share. The meter counts memory itself: a ``TorchDispatchMode``
(:mod:`gpulab.devices.meter_attribution`) sees every aten op and its outputs; every output with a storage
it has not seen is a new allocation, attributed to a logical device and watched with a weak
reference that fires when the storage is really freed (a storage keeps its Python object alive
while any tensor or view uses it: PyObject preservation, so the reference dies with the memory).

Attribution of a new storage: the destination of a ``gpulab.parallel.comm`` transfer; else the
device of the op's inputs; else this thread's current device (``with dev:``); else device 0.
Views are not counted twice; freed storages are subtracted. Threads started (and
``ThreadPoolExecutor`` tasks submitted) while the meter is active are followed, each in a mode of
its own (:mod:`gpulab.devices.meter_threads`); autograd's backward runs in the calling thread on the CPU,
and its ops are attributed from their inputs (gradients, saved tensors), so a gradient lands on the
device of the tensor it belongs to.

Example::

    devices = logical_devices(2)
    meter = MemoryMeter(budget=64 * 2**20)     # 64 MiB per device
    meter.track(model, devices[0])             # built before the meter: count its parameters
    with meter:
        loss = model(comm.to(x, devices[0])).sum()
        loss.backward()
    print(meter.report())                      # the table; meter.report().plot() draws it
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from gpulab.devices import meter_threads as threads
from gpulab.devices import registry as placement
from gpulab.devices.logical import LogicalDevice
from gpulab.devices.meter_attribution import MeterMode
from gpulab.devices.meter_ledger import _Ledger
from gpulab.devices.meter_report import (
    MemoryReport,
    _cuda_allocator_stats,
    format_bytes,
    plot_timeline,
)
from gpulab.devices.registry import LOCK, register, storage_of
from gpulab.devices.validate import check_device, check_devices

__all__ = ["MemoryMeter"]

_NEW, _ACTIVE, _CLOSED = "not entered", "active", "exited"


def _check_budget(budget: Any) -> int | None:
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ValueError(f"budget is bytes per device, a positive int (e.g. 64 * 2**20 for 64 MiB) or "
                         f"None for no limit; got {budget!r}")
    return budget


class MemoryMeter:
    """Live and peak bytes of tensor storage per logical device (see the module docstring).

    Args:
        budget: bytes per device; an allocation that would take a device past it raises
            ``torch.OutOfMemoryError`` (shaped like CUDA's). None: no limit.
        devices: the devices measured: reported even if unused, the first one on a physical device
            is "device 0" there, and a ``gpulab.parallel.comm`` transfer to any other device is
            refused while the meter is active. By default, the devices that appear.
        timeline: record every allocation and free, for :meth:`plot_timeline`.

    A meter measures once: enter it with ``with meter:``; read :meth:`live`, :meth:`peak` and
    :meth:`report` inside or after the block (``live`` is then what was live at exit). A second
    meter entered inside the first counts too, each on its own.

    Raises:
        ValueError: for a budget that is not a positive int.

    Warning:
        Only storages created while the meter is active, or passed to :meth:`track`, are counted:
        a model built before ``with meter:`` is invisible until tracked. On a CPU-only machine the
        host and the devices share memory, so data made inside the meter outside any device
        context (a batch, say) counts on device 0; make it before entering to leave it out.
        Threads already running when the meter is entered are not followed, except for tasks
        submitted to a ``ThreadPoolExecutor`` afterwards.
    """

    def __init__(self, budget: int | None = None, *, devices: Iterable[LogicalDevice] | None = None,
                 timeline: bool = True) -> None:
        self._ledger = _Ledger(_check_budget(budget), timeline)
        self._devices = check_devices(devices, usable=False) if devices else []
        for d in self._devices:
            self._ledger.see(d)
        self._fallback: dict[torch.device, LogicalDevice | None] = {}  # attribution rule 4, per physical
        self._state = _NEW
        self._tls = threading.local()  # .depth: this meter's modes active in the thread
        self._mode: MeterMode | None = None
        self._owner: int | None = None
        self._enter_seq = 0  # registry entries after this were created while active

    # -- entering and leaving -----------------------------------------------------------------

    def __enter__(self) -> "MemoryMeter":
        if self._state is _ACTIVE:
            raise RuntimeError("this MemoryMeter is already active (entered twice). A meter measures one "
                               "stretch of work: to measure a part separately, nest a new MemoryMeter() "
                               "inside it (both count)")
        if self._state is _CLOSED:
            raise RuntimeError("this MemoryMeter has already finished its measurement: create a new "
                               "MemoryMeter() for each measurement (this one's results stay readable)")
        with LOCK:
            self._ledger.check_budget(self._ledger.budget)
            self._enter_seq = placement.next_seq()
            self._ledger.t0 = time.perf_counter()
        self._owner = threading.get_ident()
        self._state = _ACTIVE
        self._mode = MeterMode(self)
        self._mode.__enter__()
        threads.follow(self)
        if self._devices:
            placement.push_scope(tuple(self._devices))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._state is not _ACTIVE:
            raise RuntimeError("this MemoryMeter is not active: use it as `with meter:`")
        if threading.get_ident() != self._owner:
            raise RuntimeError("a MemoryMeter must be exited in the thread that entered it")
        # _get_current_dispatch_mode is private torch API: the only way to ask which mode is innermost
        if _get_current_dispatch_mode() is not self._mode:
            raise RuntimeError("nested MemoryMeters (and dispatch modes) must be exited innermost first")
        threads._unfollow(self)
        if self._devices:
            placement.pop_scope(tuple(self._devices))
        with LOCK:
            self._state = _CLOSED  # modes left in threads that outlive the meter go inert
            self._ledger.frozen = True
        self._mode.__exit__(*exc)
        self._mode = None

    @property
    def active(self) -> bool:
        """True between entering and leaving the ``with`` block."""
        return self._state is _ACTIVE

    def _follow_here(self, stack: contextlib.ExitStack) -> None:
        """Enter a fresh mode of this meter in the current thread, unless one is active here."""
        if self._state is _ACTIVE and not getattr(self._tls, "depth", 0):
            stack.enter_context(MeterMode(self))

    # -- the budget ------------------------------------------------------------------------------

    @property
    def budget(self) -> int | None:
        """Bytes per device (None: no limit). Settable, but not below what is already live."""
        return self._ledger.budget

    @budget.setter
    def budget(self, value: int | None) -> None:
        value = _check_budget(value)
        with LOCK:
            self._ledger.check_budget(value)
            self._ledger.budget = value

    # -- counting what existed before -----------------------------------------------------------

    def track(self, obj: torch.Tensor | nn.Module | Iterable[torch.Tensor], dev: LogicalDevice) -> int:
        """Count tensors that already exist (a model's parameters, a replica) on ``dev``.

        A module contributes its parameters, buffers and existing ``.grad``\\ s. A storage is
        counted once however many tensors or views share it, and is subtracted when freed, like
        any other. The storages are also placed on ``dev`` (:func:`gpulab.devices.placement`), so
        what is computed from them is attributed there. Call it before entering or while active.

        Args:
            obj: a tensor, a module, or an iterable of tensors.
            dev: the logical device they live on.

        Returns:
            The bytes newly counted.

        Raises:
            TypeError: if ``dev`` is not a LogicalDevice or ``obj`` holds something else.
            ValueError: if a tensor is on another physical device, or gpulab already places its
                storage on another logical device (send a copy there with ``comm.to`` instead).
            torch.OutOfMemoryError: if it takes ``dev`` past the budget.
            RuntimeError: after the meter has exited.
        """
        if self._state is _CLOSED:
            raise RuntimeError("track() after the meter exited: track before or inside `with meter:`")
        dev = check_device(dev, "dev", usable=False)
        if isinstance(obj, nn.Module):
            tensors = [*obj.parameters(), *obj.buffers()]
            tensors += [p.grad for p in obj.parameters() if p.grad is not None]
        else:
            tensors = [obj] if isinstance(obj, torch.Tensor) else list(obj)
        added = 0
        with LOCK:
            self._ledger.see(dev)
            for i, t in enumerate(tensors):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"track() counts tensors or modules; item {i} is {type(t).__name__}")
                if t.device != dev.physical:
                    raise ValueError(f"tensor {i} {tuple(t.shape)} is on {t.device} but {dev!r} is on "
                                     f"{dev.physical}: move it first, e.g. gpulab.parallel.comm.to(x, dev)")
                s = storage_of(t)
                if s is None or not s.nbytes():
                    continue
                entry = register(s, dev)
                if entry.device != dev:
                    raise ValueError(f"tensor {i} {tuple(t.shape)} already lives on {entry.device} "
                                     f"(gpulab.devices.placement), not {dev}: track it there, or send a "
                                     f"copy with gpulab.parallel.comm.to(x, devices[{dev.index}])")
                if self._ledger not in entry.ledgers:
                    self._ledger.count(entry)
                    added += entry.nbytes
        return added

    # -- reading the results ---------------------------------------------------------------------

    def _key(self, dev: LogicalDevice | int) -> LogicalDevice | None:
        if self._state is _NEW:
            raise RuntimeError("read a MemoryMeter inside or after `with meter:`; it has not been entered "
                               "yet, so it has measured nothing")
        if isinstance(dev, int) and not isinstance(dev, bool):
            matches = [d for d in self._ledger.counts if d.index == dev]
            return next((d for d in matches if d.physical.type != "cpu"), matches[0] if matches else None)
        return check_device(dev, "dev", usable=False)

    def live(self, dev: LogicalDevice | int) -> int:
        """Bytes live on ``dev`` (a LogicalDevice or its index) now, or at exit once exited."""
        key = self._key(dev)
        with LOCK:
            return self._ledger.live(key)

    def peak(self, dev: LogicalDevice | int) -> int:
        """The most bytes live on ``dev`` at once, since entry (or tracking) or :meth:`reset_peak`."""
        key = self._key(dev)
        with LOCK:
            return self._ledger.peak(key)

    def reset_peak(self) -> None:
        """Peaks start again from what is live now (like ``torch.cuda.reset_peak_memory_stats``)."""
        with LOCK:
            self._ledger.reset_peak()

    @property
    def devices(self) -> list[LogicalDevice]:
        """Every device that was given, tracked, or allocated on, by index."""
        with LOCK:
            return self._ledger.devices()

    def report(self) -> MemoryReport:
        """The figures per device: print it for a table, ``.plot()`` for a bar chart, ``.to_dict()``
        for plain numbers. On CUDA it also holds the allocator's own statistics."""
        self._key(0)  # refuses a meter never entered
        with LOCK:
            rows = self._ledger.rows()
        cuda = {}
        for phys in dict.fromkeys(r.device.physical for r in rows):
            stats = _cuda_allocator_stats(phys)
            if stats:
                cuda[str(phys)] = stats
        return MemoryReport(rows, self._ledger.budget, cuda)

    def timeline(self) -> list[tuple[float, LogicalDevice, int]]:
        """``(seconds since entry, device, live bytes after)`` for each allocation and free."""
        with LOCK:
            return self._ledger.timeline()

    def plot_timeline(self, ax: Any = None) -> Any:
        """Live MiB per device over time, with the budget dashed. Returns the matplotlib Axes."""
        return plot_timeline(self.timeline(), self.devices, self._ledger.budget, self._ledger.truncated, ax)

    def __repr__(self) -> str:
        with LOCK:
            peaks = ", ".join(f"{r.device}: {format_bytes(r.peak)}" for r in self._ledger.rows())
        return f"MemoryMeter({self._state}, budget={self.budget}, peaks: {peaks or 'none'})"
