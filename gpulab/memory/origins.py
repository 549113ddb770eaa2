"""Where each tensor was created: a short Python stack per new storage, for the leak finder.

:class:`OriginTracer` is a ``TorchDispatchMode``. For every aten op that makes a new storage it
records the storage's size, shape, dtype, the step it was made in, and the Python frames that led
to it, torch's own frames left out (the line in *your* loop, and the model code under it). A weak
reference drops the record when the storage is freed, so what remains is exactly what survived.

Costs are bounded: only new storages are recorded (views and in-place results are skipped, as in
:mod:`gpulab.devices.meter_attribution`); each record walks at most ``max_frames`` frames and keeps
``(code, line)`` pairs, never the frames (a frame holds its locals alive: keeping one would itself
leak); and at most ``max_records`` storages are followed at once (later ones are counted, not
recorded). On a CPU the backward pass runs in the calling thread, so its storages point at the
``loss.backward()`` line; on CUDA autograd's device threads have no user frames, and those records
say ``(autograd)``.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from types import CodeType, FrameType

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # a private module; torch has no public path

from gpulab.devices.meter_attribution import FRESH, MUTATE, VIEW, _kind, _tensors

__all__ = ["OriginTracer", "Origin", "Frame"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = os.path.dirname(threading.__file__) + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The instruments' own frames (dispatch modes, thread wrappers): never the answer to "where".
_INSTRUMENTS = {_HERE + f for f in ("attribution.py", "meter.py", "threads.py", "ledger.py", "origins.py",
                                    "leaks.py")}
_internal: dict[CodeType, bool] = {}  # per code object: deciding costs string tests, on every allocation


def _is_internal(code: CodeType) -> bool:
    """torch's frames, the standard library's (contextlib...) and the instruments' are skipped."""
    if code not in _internal:
        filename = code.co_filename
        in_stdlib = filename.startswith(_STDLIB_DIR) and "-packages" not in filename  # site-packages is not
        _internal[code] = filename.startswith(_TORCH_DIR) or in_stdlib or filename in _INSTRUMENTS
    return _internal[code]


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    """The memory behind ``t``, or None for a tensor without a storage of its own (a wrapper
    subclass, a sparse or nested tensor)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None

# Storages are keyed by ``storage._cdata`` (private): the address of the C++ StorageImpl, the same
# for every Python object of one storage and unique while the storage lives.


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


class OriginTracer(TorchDispatchMode):
    """Records the origin of every new storage made while it is active (one thread).

    A ``TorchDispatchMode`` sees every aten op (torch's "Extending PyTorch" notes document
    ``__torch_dispatch__``), although the class itself lives in the private
    ``torch.utils._python_dispatch``.

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
        # A private hook of TorchDispatchMode: by default torch wraps __torch_dispatch__ in
        # torch._disable_dynamo, which imports torch._dynamo (seconds) on the first op. Nothing
        # here is compiled, so opt out (as MeterMode does).
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kind = _kind(func)
        if kind is VIEW or kind is MUTATE:
            return out  # no new memory: a view shares its input's storage, in-place writes into it
        # An op may return one of its inputs' storages (ops marked NEW can): that is not new.
        # lift_fresh (FRESH) returns the tensor torch.tensor(data) made outside the dispatcher.
        inputs: set[int] = set()
        if kind is not FRESH:
            for arg in (*args, *kwargs.values()):
                for t in _tensors(arg):
                    storage = _storage(t)
                    if storage is not None:
                        inputs.add(storage._cdata)
        stack = None  # walked once per op, and only if one of its outputs is recorded
        for t in _tensors(out):
            storage = _storage(t) if t.device.type != "meta" else None  # meta: no memory behind it
            if storage is None or storage._cdata in inputs or not storage.nbytes():
                continue
            key = storage._cdata
            with self._lock:
                old = self._refs.get(key)
                if old is not None and old() is not None:
                    continue  # already followed: a second tensor on the same storage
                if len(self.records) >= self.max_records:
                    self.dropped += 1
                    continue
                if stack is None:
                    stack = self._stack()
                self.records[key] = Origin(storage.nbytes(), tuple(t.shape), t.dtype, self.step, stack)
                # the weak reference calls _forget(key, ref) when the storage is freed
                self._refs[key] = weakref.ref(storage, functools.partial(self._forget, key))
        return out

    def _forget(self, key: int, ref: weakref.ref) -> None:
        with self._lock:
            if self._refs.get(key) is ref:  # not a newer storage that reuses the freed address
                del self._refs[key]
                self.records.pop(key, None)

    def _stack(self) -> tuple[tuple[CodeType, int], ...]:
        """``(code, line)`` of the user frames that led to the current op, innermost first.

        Code objects and line numbers only: a frame object holds its locals alive, so keeping
        one would itself leak.
        """
        kept: list[tuple[CodeType, int]] = []
        # sys._getframe (CPython's, underscored but documented) is the calling frame without the
        # cost of building a traceback; 2 skips this method and __torch_dispatch__
        try:
            frame: FrameType | None = sys._getframe(2)
        except ValueError:  # no user frames: on a GPU, backward's ops run in autograd's own C++ thread
            return ()
        for _ in range(self.max_frames):  # walk outwards, through torch's frames too
            if frame is None or len(kept) >= self.max_kept:
                break
            if not _is_internal(frame.f_code):
                kept.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        return tuple(kept)

    def alive(self) -> list[Origin]:
        """Origins of the traced storages still alive now."""
        with self._lock:
            return list(self.records.values())

