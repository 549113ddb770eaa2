"""Which storages an op created, and which logical device each one belongs to.

:class:`MeterMode` is the ``TorchDispatchMode`` behind a :class:`~gpulab.devices.MemoryMeter`: it
runs each aten op, then looks at the outputs. An output whose storage is one of the inputs' (a
view, an in-place result) or already known is not new. Views are recognised from the op's schema
(``Tensor(a)`` returns alias an input) and by comparing storages, which also catches
``_unsafe_view``. A new storage is attributed by the first rule that applies:

1. inside a :mod:`gpulab.parallel.comm` transfer, its destination (``gpulab.devices.logical.placing``);
2. the device of the op's inputs: the first input whose storage gpulab has placed; for list ops
   (``torch._foreach_*``, one output per parameter) the inputs at the same position;
3. this thread's current device (``with dev:``);
4. device 0: the meter's first device on that physical device, else ``logical:k`` for ``cuda:k``
   and ``logical:0`` for the CPU. On a machine with GPUs a CPU tensor that no rule places is host
   memory, which is not counted.

Ops run inside a kernel (a convolution's workspace) are not seen: the figures are the tensors
the program holds, which is what a lesson reasons about.
"""

from __future__ import annotations

from typing import Any

import torch

# TorchDispatchMode lives in a private module, but it is the documented way to see every op (the
# __torch_dispatch__ tutorials import it from here); storages are keyed by ``_cdata`` as in registry.py
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab.devices import logical
from gpulab.devices.logical import LogicalDevice, current_device
from gpulab.devices.physical import default_device
from gpulab.devices.registry import ENTRIES, LOCK, default_for, register, storage_of

__all__ = ["MeterMode"]

# How an op's outputs relate to its inputs, from its schema (cached per OpOverload).
VIEW, MUTATE, NEW, FRESH = "view", "mutate", "new", "fresh"
_kinds: dict[Any, str] = {}


def _kind(func: Any) -> str:
    kind = _kinds.get(func)
    if kind is None:
        if func is torch.ops.aten.lift_fresh.default:
            kind = FRESH  # torch.tensor(data): the storage was made outside the dispatcher
        else:
            infos = [r.alias_info for r in getattr(getattr(func, "_schema", None), "returns", ())]
            if any(i is not None and i.is_write for i in infos):
                kind = MUTATE  # in-place or out=: the same storage, perhaps resized
            elif any(i is not None for i in infos):
                kind = VIEW
            else:
                kind = NEW
        _kinds[func] = kind
    return kind


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Tensors in an op's argument or result: the object itself, or the items of a list/tuple."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for t in obj if isinstance(t, torch.Tensor)]
    return []


def _tag(t: Any) -> LogicalDevice | None:
    s = storage_of(t) if isinstance(t, torch.Tensor) else None
    entry = ENTRIES.get(s._cdata) if s is not None else None
    return entry.device if entry is not None else None


class MeterMode(TorchDispatchMode):
    """One thread's mode for a meter (one instance per thread: a mode must not be shared)."""

    def __init__(self, meter: Any) -> None:
        super().__init__()
        self.meter = meter

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._dynamo.disable unless this says False:
        # that imports torch._dynamo on the first op (about 3 s on a 2-core laptop) and costs
        # about 2 us per op. A meter is not meant to run under torch.compile.
        return False

    def __enter__(self) -> "MeterMode":
        result = super().__enter__()
        self.meter._tls.depth = getattr(self.meter._tls, "depth", 0) + 1
        return result

    def __exit__(self, *exc: Any) -> None:
        self.meter._tls.depth -= 1
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.meter.active:  # inert once the meter exited (a thread that outlived it)
            _observe(self.meter, func, args, kwargs, out)
        return out


def attribute(meter: Any, physical: torch.device, tags: list[LogicalDevice]) -> LogicalDevice | None:
    """The logical device of a new storage on ``physical`` (rules 1-4), None for host memory."""
    if physical.type == "meta":
        return None  # shapes only, no memory
    forced = logical.forced_device()
    if forced is not None and forced.physical == physical:
        return forced
    for dev in tags:
        if dev.physical == physical:
            return dev
    cur = current_device()
    if cur is not None and cur.physical == physical:
        return cur
    cache = meter._fallback
    if physical not in cache:
        dev = next((d for d in meter._devices if d.physical == physical), None)
        if dev is None and (physical.type != "cpu" or default_device().type == "cpu"):
            dev = default_for(physical)
        cache[physical] = dev
    return cache[physical]


def _walk(arg: Any, keys: set[int], tags: list[LogicalDevice]) -> None:
    """Add the storage keys of the tensors in one op argument to ``keys``, their devices to ``tags``."""
    if isinstance(arg, torch.Tensor):
        items: Any = (arg,)
    elif isinstance(arg, (list, tuple)):
        items = arg
    else:
        return
    for t in items:
        if isinstance(t, torch.Tensor):
            try:
                key = t.untyped_storage()._cdata
            except (RuntimeError, NotImplementedError):  # sparse, nested: no single storage
                continue
            keys.add(key)
            entry = ENTRIES.get(key)
            if entry is not None:
                tags.append(entry.device)


def _observe(meter: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """Count the storages ``func`` created (called after the op ran, for every op: keep it lean)."""
    kind = _kinds.get(func) or _kind(func)
    if kind is VIEW:
        return
    if isinstance(out, torch.Tensor):
        outs: Any = (out,)
    elif isinstance(out, (list, tuple)) and out:
        outs = out
    else:
        return
    ledger = meter._ledger
    with LOCK:
        if kind is MUTATE:
            for t in _tensors(outs):
                s = storage_of(t)
                entry = ENTRIES.get(s._cdata) if s is not None else None
                if entry is not None and ledger in entry.ledgers and entry.nbytes != s.nbytes():
                    ledger.resize(entry, s.nbytes())
            return
        keys: set[int] = set()
        tags: list[LogicalDevice] = []
        if kind is not FRESH:
            for arg in args:
                _walk(arg, keys, tags)
            for arg in kwargs.values():
                _walk(arg, keys, tags)
        lists = None
        if len(outs) > 1:  # list ops (torch._foreach_*): output i goes with the inputs at position i
            lists = [a for a in args if isinstance(a, (list, tuple)) and len(a) == len(outs)]
        for i, t in enumerate(outs):
            if not isinstance(t, torch.Tensor):
                continue
            try:
                s = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = s._cdata
            if key in keys:
                continue  # a view of an input, or the input itself
            entry = ENTRIES.get(key)
            if entry is not None and entry.ref() is not None:
                if ledger not in entry.ledgers and entry.seq > meter._enter_seq:
                    ledger.count(entry)  # made by this op, registered a moment ago by an outer meter
                continue
            own = tags
            if lists:
                own = [d for d in (_tag(lst[i]) for lst in lists) if d is not None] + tags
            dev = attribute(meter, t.device, own)
            if dev is None:
                continue
            # 0 bytes is kept: torch.empty(0) passed as out= grows later. The budget is checked
            # first, so a refused storage is never counted.
            ledger.check_fits(dev, s.nbytes())
            ledger.count(register(s, dev))
