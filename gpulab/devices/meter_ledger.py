"""A meter's ledger: live, peak and allocated bytes per logical device, the budget, the timeline.

Every method is called with :data:`gpulab.devices.registry.LOCK` held: replica threads, autograd and the
weak-reference callbacks of freed storages all update the same ledger.
"""

from __future__ import annotations

import time
from collections import Counter

import torch

from gpulab.devices.logical import LogicalDevice
from gpulab.devices.meter_report import DeviceMemory, _oom_message, format_bytes
from gpulab.devices.registry import Entry

__all__: list[str] = []  # the package's own machinery: nothing here is public

_TIMELINE_CAP = 200_000  # events kept for the timeline plot (about 20 MB); later ones are dropped


class _Counts:
    """Bytes on one device (one record, so that counting an allocation is one dict lookup)."""

    __slots__ = ("device", "live", "peak", "allocated")

    def __init__(self, device: LogicalDevice) -> None:
        self.device = device  # the most informative object for this device (simulated or not)
        self.live = self.peak = self.allocated = 0


class _Ledger:
    """The counts of one :class:`~gpulab.devices.MemoryMeter`.

    Args:
        budget: bytes per device, or None.
        timeline: record every allocation and free.
    """

    def __init__(self, budget: int | None, timeline: bool) -> None:
        self.budget = budget
        self.frozen = False  # set when the meter exits: frees after that do not change the figures
        self.counts: dict[LogicalDevice, _Counts] = {}
        self.record_timeline = timeline
        self.events: list[tuple[float, _Counts, int]] = []
        self.truncated = False
        self.t0 = time.perf_counter()

    def see(self, dev: LogicalDevice) -> _Counts:
        """The record of ``dev``, made on first sight (keeping the object that says it is simulated)."""
        counts = self.counts.get(dev)
        if counts is None:
            counts = self.counts[dev] = _Counts(dev)
        elif dev.simulated and not counts.device.simulated:
            counts.device = dev
        return counts

    def live(self, dev: LogicalDevice) -> int:
        """Bytes live on ``dev`` (0 for a device never seen)."""
        counts = self.counts.get(dev)
        return counts.live if counts is not None else 0

    def peak(self, dev: LogicalDevice) -> int:
        """The peak on ``dev`` (0 for a device never seen)."""
        counts = self.counts.get(dev)
        return counts.peak if counts is not None else 0

    def check_fits(self, dev: LogicalDevice, nbytes: int) -> None:
        """Raise ``torch.OutOfMemoryError`` if ``nbytes`` more would take ``dev`` past the budget."""
        if self.budget is None:
            return
        counts = self.counts.get(dev)
        live = counts.live if counts is not None else 0
        if live + nbytes > self.budget:
            shown = counts.device if counts is not None else dev
            raise torch.OutOfMemoryError(_oom_message(shown, nbytes, live, self.budget))

    def check_budget(self, budget: int | None) -> None:
        """Raise ValueError if ``budget`` is below what is already live on some device."""
        if budget is None:
            return
        for counts in self.counts.values():
            if counts.live > budget:
                raise ValueError(
                    f"budget={format_bytes(budget)} is smaller than the {format_bytes(counts.live)} already "
                    f"live on {counts.device!r}: give at least {counts.live} bytes, or free (or do not "
                    "track) tensors first")

    def _add(self, counts: _Counts, nbytes: int) -> None:
        live = counts.live = counts.live + nbytes
        if live > counts.peak:
            counts.peak = live
        if nbytes > 0:
            counts.allocated += nbytes
        if self.record_timeline:
            if len(self.events) < _TIMELINE_CAP:
                self.events.append((time.perf_counter() - self.t0, counts, live))
            else:
                self.truncated = True

    def count(self, entry: Entry) -> None:
        """Count a storage (once): checks the budget, then adds it to its device."""
        counts = self.see(entry.device)
        if self.budget is not None:
            self.check_fits(entry.device, entry.nbytes)
        entry.ledgers.append(self)
        self._add(counts, entry.nbytes)

    def release(self, entry: Entry) -> None:
        """A counted storage was freed (called by the registry's weak-reference callback)."""
        if not self.frozen:
            self._add(self.counts[entry.device], -entry.nbytes)

    @staticmethod
    def resize(entry: Entry, nbytes: int) -> None:
        """A counted storage changed size in place (``resize_``, an ``out=`` op): tell every ledger."""
        delta = nbytes - entry.nbytes
        if delta > 0:
            for ledger in entry.ledgers:
                ledger.check_fits(entry.device, delta)
        entry.nbytes = nbytes
        for ledger in entry.ledgers:
            if not ledger.frozen:
                ledger._add(ledger.counts[entry.device], delta)

    def reset_peak(self) -> None:
        """Peaks start again from what is live now."""
        for counts in self.counts.values():
            counts.peak = counts.live

    def _shown(self) -> dict[int, LogicalDevice]:
        # A device that shares its physical device with another is shown as simulated: one placed
        # by rule 4 of attribution was made without knowing how many devices the lesson uses.
        shared = Counter(c.device.physical for c in self.counts.values())
        return {id(c): c.device if c.device.simulated or shared[c.device.physical] == 1
                else LogicalDevice(c.device.index, c.device.physical, True) for c in self.counts.values()}

    def devices(self) -> list[LogicalDevice]:
        """The devices seen, by index."""
        return sorted(self._shown().values(), key=lambda d: (d.index, str(d.physical)))

    def rows(self) -> list[DeviceMemory]:
        """One report row per device, by index."""
        shown = self._shown()
        rows = [DeviceMemory(shown[id(c)], c.live, c.peak, c.allocated, self.budget) for c in self.counts.values()]
        return sorted(rows, key=lambda r: (r.device.index, str(r.device.physical)))

    def timeline(self) -> list[tuple[float, LogicalDevice, int]]:
        """``(seconds since entry, device, live bytes after)`` per allocation and free."""
        shown = self._shown()
        return [(t, shown[id(c)], live) for t, c, live in self.events]
