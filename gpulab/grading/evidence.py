"""Evidence, not verdicts: what a test cell sends to the grader, and in which mode it runs.

A test cell runs in one of three modes, set by the process that started the kernel:

- ``interactive`` (the default: Run All, Validate, ``make check``): each ``grading.check_*``
  compares at once and raises :class:`~gpulab.grading.checks.GradingError` with today's message.
- ``graded`` (``GPULAB_GRADING=graded``: the student's kernel under ``make grade``): each check
  only *sends the value the student's code produced*, as plain data, and never decides anything.
  No expected value exists here: hidden tests name none, so the student's code cannot read one.
- ``reference`` (``GPULAB_GRADING=reference``: a clean kernel that runs the lab's source notebook
  once per grading run): each check sends the solution's value (the expected side), a visible
  test's literal, and the check itself (kind, tolerances, bounds, rule, the message texts).

The grader pairs the two streams cell by cell, in order, and decides in its own process
(:mod:`gpulab.verdict`). Both kernels draw their inputs from the same :func:`seed`, fresh for
every ``make grade`` and never written in the notebook.

A record crosses as one ``display_data`` message of type :data:`MIME` holding JSON: numbers,
strings, lists and the tagged forms of :func:`encode` (tensors as raw little-endian bytes in
base64). Nothing is pickled; whatever the kernel sends is only data to the grader.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import os
import random
import sys
from typing import Any, Callable

MIME = "application/vnd.gpulab.evidence+json"
INTERACTIVE, GRADED, REFERENCE = "interactive", "graded", "reference"
DEFAULT_SEED = 20240601  # interactive runs: the same inputs every time
MAX_DEPTH = 12


def mode() -> str:
    """``interactive``, ``graded`` or ``reference`` (from ``GPULAB_GRADING``)."""
    m = os.environ.get("GPULAB_GRADING", INTERACTIVE)
    return m if m in (GRADED, REFERENCE) else INTERACTIVE


def seed() -> int:
    """This grading run's seed (``GPULAB_SEED``), or a fixed one outside the grader.

    Hidden tests build their inputs from it, so the inputs change with every ``make grade`` and
    cannot be answered from a list.
    """
    raw = os.environ.get("GPULAB_SEED", "")
    return int(raw) % 2**31 if raw.isdigit() else DEFAULT_SEED


def rng(salt: str = "") -> random.Random:
    """A ``random.Random`` drawn from :func:`seed` (``salt`` gives each test its own stream)."""
    return random.Random(f"{seed()}:{salt}")


# ---- encoding: plain JSON with tagged forms ----------------------------------------------------

def _qualname(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-able data (see the module doc). Honest values encode exactly; the grader
    never trusts the result, it only compares it."""
    if depth > MAX_DEPTH:
        raise ValueError("evidence nested too deeply")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        v = int.__index__(value)
        return v if abs(v) < 2**53 else {"$int": str(v)}
    if isinstance(value, float):
        v = float.__float__(value)
        return v if math.isfinite(v) else {"$float": repr(v)}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (tuple, list)) and type(value) not in (tuple, list):  # a namedtuple, a subclass
        kind = "namedtuple" if hasattr(value, "_fields") else "tuple" if isinstance(value, tuple) else "list"
        return {"$seq": {"type": type(value).__qualname__, "kind": kind, "items": [encode(v, depth + 1) for v in value]}}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {"$dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"$set": [encode(v, depth + 1) for v in value]}
    if isinstance(value, BaseException):
        names = [c.__name__ for c in type(value).__mro__ if c is not object]
        return {"$exc": {"types": names[:12], "message": str(value)[:4000]}}
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return _tensor(value, torch)
        if isinstance(value, torch.dtype):
            return {"$dtype": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"$device": str(value)}
        if isinstance(value, torch.Size):
            return {"$tuple": [int(v) for v in value]}
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray):
            return _array(value, np)
        if isinstance(value, np.generic):
            return encode(value.item(), depth + 1)
        if isinstance(value, np.dtype):
            return {"$dtype": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [[f.name, encode(getattr(value, f.name), depth + 1)] for f in dataclasses.fields(value)]
        return {"$dataclass": {"type": type(value).__name__, "fields": fields}}
    return {"$object": {"type": _qualname(value), "repr": repr(value)[:300]}}


def _array(a: Any, np: Any) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    if a.dtype == object:
        raise TypeError("a numpy array of Python objects cannot be sent as evidence")
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return {"$tensor": {"dtype": str(a.dtype), "shape": list(a.shape),
                        "data": base64.b64encode(a.tobytes()).decode("ascii")}}


def _tensor(t: Any, torch: Any) -> dict[str, Any]:
    t = t.detach()
    if t.is_sparse or t.layout != torch.strided:
        t = t.to_dense()
    if t.device.type == "meta":  # no data: shape, dtype and device are the evidence
        return {"$tensor": {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                            "device": "meta", "data": None}}
    device = t.device.type
    t = t.cpu().contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its raw 16 bits cross, the grader widens them
        raw = t.view(torch.int16).numpy().astype("<i2").tobytes()
    elif t.dtype == torch.bool:
        raw = t.numpy().astype("u1").tobytes()
    else:
        raw = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
    return {"$tensor": {"dtype": dtype, "shape": list(t.shape), "device": device,
                        "data": base64.b64encode(raw).decode("ascii")}}


# ---- sending -----------------------------------------------------------------------------------

def emit(record: dict[str, Any]) -> None:
    """Send one record to the grader (a ``display_data`` of type :data:`MIME`)."""
    try:
        from IPython.display import display
    except ImportError:  # not in a kernel: nothing listens
        return
    display({MIME: record, "text/plain": ""}, raw=True)


# ---- work the grader measures from its own side (grading.check_measured) -----------------------

_MEASURED: dict[int, Callable[[int], Any]] = {}


def register_measured(work: Callable[[int], Any]) -> int:
    """Keep ``work`` (``fn(seed)``) for the grader's measured requests; returns its id."""
    ident = len(_MEASURED)
    _MEASURED[ident] = work
    return ident


def run_measured(ident: int, seed_: int) -> None:
    """What the grader's measured request runs: the one piece of work ``ident`` names, on a seed it
    reveals only now; the result goes back as evidence, to be compared with the reference run's."""
    result = _MEASURED[ident](seed_)
    from gpulab.devices.physical import synchronize_all

    synchronize_all()  # the grader's clock stops at the reply: queued GPU work must be done by then
    emit({"kind": "result", "value": encode(result)})
