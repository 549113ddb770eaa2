"""Placement: which logical device each tensor lives on, recorded per storage.

:mod:`gpulab.parallel.comm` (transfers), :class:`gpulab.devices.MemoryMeter` (every new storage
while it is active) and ``MemoryMeter.track`` write the registry; :func:`placement` reads it.
Views share their base's storage, so they share its device. An entry is dropped by a
weak-reference callback when the storage is really freed: a storage keeps its Python object alive
for as long as any tensor or view uses it (PyObject preservation), so the callback fires exactly
when the memory goes away, and a meter subtracts it then.

Also here: the device lists of active meters made with ``devices=``, which a transfer must respect.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from gpulab.devices.logical import LogicalDevice

__all__ = ["placement"]


class Entry:
    """What is known about one storage: its device, its size, and the meters counting it."""

    __slots__ = ("device", "nbytes", "ledgers", "ref", "seq")

    def __init__(self, device: LogicalDevice, nbytes: int, ref: weakref.ref, seq: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self.ledgers: list[Any] = []  # the MemoryMeters' ledgers that counted it; told when it is freed
        self.ref = ref
        self.seq = seq  # registration order: a meter entered later did not see it being created


# One registry for the process, as torch keeps one allocator per device: a storage's logical
# device is a fact about the storage, shared by every meter and thread. Keyed by the address of
# the C++ StorageImpl (``_cdata``), unique while the storage lives.
LOCK = threading.RLock()  # re-entrant: a free callback can fire while this thread holds it
ENTRIES: dict[int, Entry] = {}
_seq = [0]


def _on_free(key: int, ref: weakref.ref) -> None:
    with LOCK:
        entry = ENTRIES.get(key)
        if entry is None or entry.ref is not ref:  # the address was already reused and re-registered
            return
        del ENTRIES[key]
        for ledger in entry.ledgers:
            ledger.release(entry)


def storage_of(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    """The tensor's storage, or None for tensors without one (sparse, nested)."""
    try:
        return tensor.untyped_storage()  # called for every input and output of every metered op
    except (RuntimeError, NotImplementedError):
        return None


def register(storage: torch.UntypedStorage, device: LogicalDevice) -> Entry:
    """The registry entry of ``storage``, created on ``device`` if there is none (caller holds LOCK)."""
    key = storage._cdata
    entry = ENTRIES.get(key)
    if entry is not None and entry.ref() is not None:
        return entry
    _seq[0] += 1
    entry = Entry(device, storage.nbytes(), weakref.ref(storage, lambda r, k=key: _on_free(k, r)), _seq[0])
    ENTRIES[key] = entry
    return entry


def tag(tensor: torch.Tensor, device: LogicalDevice) -> None:
    """Record that ``tensor``'s storage lives on ``device`` (a transfer's result)."""
    storage = storage_of(tensor)
    if storage is None or storage.nbytes() == 0:
        return
    with LOCK:
        entry = register(storage, device)
        if entry.device != device and not entry.ledgers:  # re-tag an uncounted storage
            entry.device = device


# The device lists of active meters made with ``devices=``: a transfer must go to one of them.
_scopes: list[tuple[LogicalDevice, ...]] = []


def push_scope(devices: tuple[LogicalDevice, ...]) -> None:
    """A meter measuring exactly ``devices`` became active."""
    with LOCK:
        _scopes.append(devices)


def pop_scope(devices: tuple[LogicalDevice, ...]) -> None:
    """That meter exited."""
    with LOCK:
        if devices in _scopes:
            _scopes.remove(devices)


def check_in_scope(dev: LogicalDevice) -> None:
    """Raise ValueError if an active meter measures a device list that ``dev`` is not in."""
    with LOCK:
        for devices in _scopes:
            if dev not in devices:
                listed = ", ".join(repr(d) for d in devices)
                raise ValueError(f"{dev!r} is not one of the devices the active MemoryMeter measures "
                                 f"({listed}): send the tensor to one of them, or create the meter with "
                                 f"devices=logical_devices(n) for the devices you use")


def next_seq() -> int:
    """The current registration counter (a meter notes it when entered)."""
    with LOCK:
        return _seq[0]


def default_for(physical: torch.device) -> LogicalDevice:
    """The logical device of a tensor nobody moved: the one numbered like its GPU, else 0."""
    return LogicalDevice(physical.index if physical.type == "cuda" and physical.index else 0, physical)


def placement(tensor: torch.Tensor) -> LogicalDevice:
    """The logical device ``tensor`` lives on.

    It is the device recorded for the tensor's storage (views share it) by a
    :mod:`gpulab.parallel.comm` transfer, by ``MemoryMeter.track``, or by an active
    :class:`gpulab.devices.MemoryMeter` when the storage was created. A tensor gpulab never saw
    (created before any meter, never moved) is on device 0 of its physical device, or on
    ``logical:k`` for ``cuda:k``, as a model built on the first GPU is on DataParallel's device 0.

    Raises:
        TypeError: if ``tensor`` is not a tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"placement() takes a tensor, got {type(tensor).__name__}")
    storage = storage_of(tensor)
    if storage is not None:
        entry = ENTRIES.get(storage._cdata)
        if entry is not None and entry.ref() is not None:
            return entry.device
    return default_for(tensor.device)
