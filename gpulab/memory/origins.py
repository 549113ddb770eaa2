"""Where each tensor was created: a short Python stack per new storage, for the leak finder.

:class:`OriginTracer` is a ``TorchDispatchMode``. For every aten op that makes a new storage it
records the storage's size, shape, dtype, the step it was made in, and the Python frames that led
to it, torch's own frames left out (the line in *your* loop, and the model code under it). A weak
reference drops the record when the storage is freed, so what remains is exactly what survived.

Costs are bounded: only new storages are recorded (views and in-place results are skipped, as in
:mod:`gpulab.memory.attribution`); each record walks at most ``max_frames`` frames and keeps
``(code, line)`` pairs, never the frames (a frame holds its locals alive: keeping one would itself
leak); and at most ``max_records`` storages are followed at once (later ones are counted, not
recorded). On a CPU the backward pass runs in the calling thread, so its storages point at the
``loss.backward()`` line; on CUDA autograd's device threads have no user frames, and those records
say ``(autograd)``.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from types import CodeType

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab.memory.attribution import FRESH, MUTATE, VIEW, _kind

__all__ = ["OriginTracer", "Origin", "Frame"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = os.path.dirname(threading.__file__) + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The instruments' own frames (dispatch modes, thread wrappers): never the answer to "where".
_INSTRUMENTS = {_HERE + f for f in ("attribution.py", "meter.py", "threads.py", "ledger.py", "origins.py",
                                    "leaks.py")}
_internal: dict[CodeType, bool] = {}


def _is_internal(code: CodeType) -> bool:
    """torch's frames, the standard library's (contextlib...) and the instruments' are skipped."""
    hit = _internal.get(code)
    if hit is None:
        name = code.co_filename
        stdlib = name.startswith(_STDLIB_DIR) and "-packages" not in name
        hit = _internal[code] = name.startswith(_TORCH_DIR) or stdlib or name in _INSTRUMENTS
    return hit


@dataclass(frozen=True)
class Frame:
    """One Python frame of an allocation's stack."""

    filename: str
    lineno: int
    function: str

    @property
    def code(self) -> str:
        """The source line (notebook cells too: IPython puts them in ``linecache``)."""
        return linecache.getline(self.filename, self.lineno).strip()

    def __str__(self) -> str:
        name = os.path.basename(self.filename)
        if "ipykernel" in self.filename:
            name = "cell"
        line = self.code.split("  # ")[0].rstrip()  # the statement, without a trailing comment
        return f"{name}:{self.lineno} in {self.function}" + (f": {line}" if line else "")


@dataclass
class Origin:
    """A storage created while traced, and still alive."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    step: int  # how many steps had completed when it was made
    stack: tuple[tuple[CodeType, int], ...]  # innermost first; (code, line) of non-torch frames

    def frames(self) -> list[Frame]:
        """The recorded frames, innermost first."""
        return [Frame(c.co_filename, line, c.co_name) for c, line in self.stack]


class OriginTracer(TorchDispatchMode):
    """Records the origin of every new storage made while it is active (one thread).

    Args:
        max_frames: frames walked per allocation (torch's own frames do not count towards the
            ``max_kept`` kept, but are walked).
        max_kept: non-torch frames kept per allocation.
        max_records: storages followed at once; beyond this, new ones are only counted in
            :attr:`dropped`.
    """

    def __init__(self, max_frames: int = 48, max_kept: int = 8, max_records: int = 100_000) -> None:
        super().__init__()
        self.max_frames, self.max_kept, self.max_records = max_frames, max_kept, max_records
        self.records: dict[int, Origin] = {}  # storage key -> origin (alive storages only)
        self._refs: dict[int, weakref.ref] = {}
        self.step = 0
        self.dropped = 0
        self._lock = threading.RLock()  # a storage freed while we hold it calls _forget here

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as MeterMode: no torch._dynamo import (seconds) on the first op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kind = _kind(func)
        if kind is VIEW or kind is MUTATE:
            return out
        outs = out if isinstance(out, (list, tuple)) else (out,)
        inputs: set[int] = set()
        if kind is not FRESH:
            for a in (*args, *(kwargs or {}).values()):
                for t in (a if isinstance(a, (list, tuple)) else (a,)):
                    if isinstance(t, torch.Tensor):
                        try:
                            inputs.add(t.untyped_storage()._cdata)
                        except (RuntimeError, NotImplementedError):
                            pass
        stack = None
        for t in outs:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            try:
                s = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = s._cdata
            if key in inputs or not s.nbytes():
                continue
            with self._lock:
                old = self._refs.get(key)
                if old is not None and old() is not None:
                    continue
                if len(self.records) >= self.max_records:
                    self.dropped += 1
                    continue
                if stack is None:
                    stack = self._stack()
                self.records[key] = Origin(s.nbytes(), tuple(t.shape), t.dtype, self.step, stack)
                self._refs[key] = weakref.ref(s, lambda r, k=key: self._forget(k, r))
        return out

    def _forget(self, key: int, ref: weakref.ref) -> None:
        with self._lock:
            if self._refs.get(key) is ref:
                del self._refs[key]
                self.records.pop(key, None)

    def _stack(self) -> tuple[tuple[CodeType, int], ...]:
        kept: list[tuple[CodeType, int]] = []
        f = sys._getframe(2)  # above __torch_dispatch__ and _stack
        for _ in range(self.max_frames):
            if f is None or len(kept) >= self.max_kept:
                break
            if not _is_internal(f.f_code):
                kept.append((f.f_code, f.f_lineno))
            f = f.f_back
        return tuple(kept)

    def alive(self) -> list[Origin]:
        """Origins of the traced storages still alive now."""
        with self._lock:
            return list(self.records.values())

