"""The evidence's encoding: what a kernel's value becomes on the wire, and what the grader reads back.

:func:`encode` runs in the kernel: numbers, strings, lists and tagged forms (``{"$tensor": ...}``,
``{"$tuple": [...]}``, ...), tensors as raw little-endian bytes in base64; nothing is pickled.
:func:`decode` runs in the grader: it refuses anything that is not one of the encoded forms, past a
size or a depth, so a value sent by a hostile kernel is either data of the expected shape or an
:class:`EvidenceError`. Decoded values are plain Python and numpy (:class:`Tensor`, :class:`Raised`,
...), with readable reprs; the grader only compares them.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import sys
from typing import Any

import numpy as np

from gpulab.evidence.values import Container, Device, Dtype, EvidenceError, Other, Raised, Record, Tensor

MAX_DEPTH = 12
MAX_ITEMS = 200_000           # list elements, dict entries, set members, per value
MAX_TENSOR_BYTES = 64 * 2**20  # one tensor's data
MAX_STRING = 100_000
DTYPES = {"float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool", "complex64", "complex128"}


# ---- encoding (in the kernel) ------------------------------------------------------------------

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


# ---- decoding (in the grader) ------------------------------------------------------------------

class _Budget:
    def __init__(self) -> None:
        self.items = 0

    def take(self, n: int) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise EvidenceError(f"more than {MAX_ITEMS} items")


def decode(data: Any, depth: int = 0, budget: _Budget | None = None) -> Any:
    """The value that :func:`encode` sent, or :class:`EvidenceError`."""
    budget = budget or _Budget()
    if depth > MAX_DEPTH:
        raise EvidenceError("nested too deeply")
    if data is None or isinstance(data, bool):
        return data
    if isinstance(data, int):
        return data
    if isinstance(data, float):
        return data
    if isinstance(data, str):
        if len(data) > MAX_STRING:
            raise EvidenceError(f"a string of {len(data)} characters")
        return data
    if isinstance(data, list):
        budget.take(len(data))
        return [decode(v, depth + 1, budget) for v in data]
    if not isinstance(data, dict) or len(data) != 1:
        raise EvidenceError(f"not an encoded value: {type(data).__name__}")
    (tag, body), = data.items()
    if tag == "$tuple":
        return tuple(decode(_list(body), depth + 1, budget))
    if tag == "$seq":
        if not isinstance(body, dict) or body.get("kind") not in ("namedtuple", "tuple", "list"):
            raise EvidenceError("a malformed sequence")
        items = decode(_list(body.get("items")), depth + 1, budget)
        return Container(_str(body.get("type"), 200), body["kind"], tuple(items))
    if tag == "$set":
        return frozenset(_hashable(v) for v in decode(_list(body), depth + 1, budget))
    if tag == "$dict":
        pairs = _list(body)
        budget.take(len(pairs))
        out = {}
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2:
                raise EvidenceError("a dict entry is not a [key, value] pair")
            out[_hashable(decode(pair[0], depth + 1, budget))] = decode(pair[1], depth + 1, budget)
        return out
    if tag == "$int":
        if not isinstance(body, str) or len(body) > 4000:
            raise EvidenceError("a malformed big integer")
        return int(body)
    if tag == "$float":
        if body not in ("nan", "inf", "-inf"):
            raise EvidenceError("a malformed float")
        return float(body)
    if tag == "$dtype":
        return Dtype(_str(body, 40))
    if tag == "$device":
        return Device(_str(body, 40))
    if tag == "$exc":
        types = body.get("types") if isinstance(body, dict) else None
        if not isinstance(types, list) or not all(isinstance(t, str) and len(t) < 200 for t in types[:20]):
            raise EvidenceError("a malformed exception")
        return Raised(tuple(types[:20]), _str(body.get("message", ""), MAX_STRING))
    if tag == "$dataclass":
        fields = _list(body.get("fields") if isinstance(body, dict) else None)
        budget.take(len(fields))
        pairs = []
        for pair in fields:
            if not isinstance(pair, list) or len(pair) != 2:
                raise EvidenceError("a malformed dataclass field")
            pairs.append((_str(pair[0], 200), _hashable(decode(pair[1], depth + 1, budget))))
        return Record(_str(body.get("type"), 200), tuple(pairs))
    if tag == "$object":
        if not isinstance(body, dict):
            raise EvidenceError("a malformed object")
        return Other(_str(body.get("type"), 300), _str(body.get("repr"), 1000))
    if tag == "$tensor":
        return _decode_tensor(body)
    raise EvidenceError(f"unknown tag {tag[:40]!r}")


def _list(body: Any) -> list:
    if not isinstance(body, list):
        raise EvidenceError("expected a list")
    return body


def _str(body: Any, limit: int) -> str:
    if not isinstance(body, str) or len(body) > limit:
        raise EvidenceError("expected a short string")
    return body


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted(((k, _hashable(v)) for k, v in value.items()), key=repr))
    if isinstance(value, Tensor):
        raise EvidenceError("a tensor cannot be a dict key or set member")
    return value


def _decode_tensor(body: Any) -> Tensor:
    if not isinstance(body, dict):
        raise EvidenceError("a malformed tensor")
    dtype, shape, data = body.get("dtype"), body.get("shape"), body.get("data")
    device = body.get("device", "cpu")
    if dtype not in DTYPES:
        raise EvidenceError(f"a tensor of dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or len(shape) > 16 or not all(isinstance(s, int) and 0 <= s < 2**40 for s in shape):
        raise EvidenceError("a malformed tensor shape")
    device = _str(device, 40)
    if data is None:
        if device != "meta":
            raise EvidenceError("a tensor without data")
        return Tensor(dtype, tuple(shape), device, None)
    if not isinstance(data, str) or len(data) > MAX_TENSOR_BYTES * 4 // 3 + 8:
        raise EvidenceError("a tensor larger than the grader reads")
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError:
        raise EvidenceError("a tensor whose data is not base64") from None
    numel = math.prod(shape)
    np_dtype = {"bfloat16": "<i2", "bool": "u1"}.get(dtype) or np.dtype(dtype).newbyteorder("<")
    itemsize = np.dtype(np_dtype).itemsize
    if len(raw) != numel * itemsize:
        raise EvidenceError(f"a tensor of shape {tuple(shape)} with {len(raw)} bytes")
    arr = np.frombuffer(raw, dtype=np_dtype).reshape(shape)
    if dtype == "bfloat16":  # the upper 16 bits of a float32
        arr = (arr.astype(np.int32).astype(np.uint32) << 16).view(np.float32)
    elif dtype == "bool":
        arr = arr.astype(bool)
    return Tensor(dtype, tuple(shape), device, arr)
