"""Decide a check from data: the student's value against the reference's, outside any kernel.

The grader (:mod:`gpulab.course.judge`) calls :func:`verdict` in its own process with what two
kernels sent (:mod:`gpulab.grading.evidence`): the student's value, and from the reference kernel
the check itself and the expected value. Interactive checks call the same function in the
student's kernel, so a message reads the same in Validate and in the feedback.

Everything here is plain Python and numpy (no torch: the grader does not import it). :func:`decode`
refuses anything that is not one of the encoded forms, past a size or a depth, so a value sent
by a hostile kernel is either data of the expected shape or a failed check.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpulab.i18n import LANGUAGES, messages  # a localized spec's language: the hint's label, the verdict
from gpulab.verdict import rules

MAX_DEPTH = 12
MAX_ITEMS = 200_000           # list elements, dict entries, set members, per value
MAX_TENSOR_BYTES = 64 * 2**20  # one tensor's data
MAX_STRING = 100_000
DTYPES = {"float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool", "complex64", "complex128"}
# torch.testing.assert_close's default tolerances (rtol, atol) by dtype; other dtypes compare exactly
TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
              "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7)}
PY_FLOAT = (1e-7, 1e-7)
# a speed check whose ``min_cores`` is above this asks for its relative bar on every machine (lab 07)
EVERY_MACHINE_CORES = 64


def relative_bar_why(min_cores: float, relative: float, cores: float | None = None) -> str:
    """Why a speed check's relative bar (``relative`` x the reference's speed-up) applies: the work
    had fewer than ``min_cores`` cores, or that bar applies on every machine."""
    if min_cores > EVERY_MACHINE_CORES:
        return f"at least {relative:.2f} x its speed-up, the bar on every machine"
    had = f"{cores:g} core(s), " if cores is not None else "the work got "
    return f"{had}fewer than {min_cores:g}"


class EvidenceError(ValueError):
    """Data that is not evidence of the expected form."""


# ---- decoded values: plain, hashable where they can be, with readable reprs ---------------------

@dataclass(frozen=True)
class Dtype:
    name: str

    def __repr__(self) -> str:
        return f"torch.{self.name}"


@dataclass(frozen=True)
class Device:
    name: str

    def __repr__(self) -> str:
        return f"device(type='{self.name}')" if ":" not in self.name else f"device('{self.name}')"


@dataclass(frozen=True)
class Record:
    """A dataclass instance, as its type's name and its fields."""

    type: str
    fields: tuple

    def __repr__(self) -> str:
        return f"{self.type}(" + ", ".join(f"{k}={v!r}" for k, v in self.fields) + ")"


@dataclass(frozen=True)
class Container:
    """A namedtuple or a subclass of tuple or list: its type's name, its kind and its items. It
    equals another of the same type, and (as in Python) a plain sequence of its kind."""

    type: str
    kind: str  # namedtuple | tuple | list
    items: tuple

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Container):
            return (self.type, self.kind, self.items) == (other.type, other.kind, other.items)
        if isinstance(other, tuple) and self.kind != "list" or isinstance(other, list) and self.kind == "list":
            return self.items == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.type, self.items))

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Any:
        return iter(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]

    def __repr__(self) -> str:
        return f"{self.type}({', '.join(map(repr, self.items))})"


@dataclass(frozen=True)
class Other:
    """Any other object, as its type and repr."""

    type: str
    repr: str

    def __repr__(self) -> str:
        return self.repr


@dataclass(frozen=True)
class Raised:
    """An exception, as the names of its classes and its message."""

    types: tuple
    message: str

    def __repr__(self) -> str:
        return f"{self.types[0]}({self.message!r})" if self.types else f"exception({self.message!r})"


@dataclass(eq=False)
class Tensor:
    """A tensor's dtype, shape, device and values (None for the meta device)."""

    dtype: str
    shape: tuple
    device: str = "cpu"
    array: np.ndarray | None = field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensor):
            return NotImplemented
        if (self.dtype, self.shape, self.device) != (other.dtype, other.shape, other.device):
            return False
        if self.array is None or other.array is None:
            return self.array is None and other.array is None
        return bool(np.array_equal(self.array, other.array))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self.array is not None and self.array.size <= 8:
            values = np.array2string(self.array, separator=", ", precision=4)
            return f"tensor({values}, dtype=torch.{self.dtype})"
        return f"tensor(shape={self.shape}, dtype=torch.{self.dtype}" + (
            f", device='{self.device}')" if self.device not in ("cpu",) else ")")


# ---- decoding ----------------------------------------------------------------------------------

class _Budget:
    def __init__(self) -> None:
        self.items = 0

    def take(self, n: int) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise EvidenceError(f"more than {MAX_ITEMS} items")


def decode(data: Any, depth: int = 0, budget: _Budget | None = None) -> Any:
    """The value that :func:`gpulab.grading.evidence.encode` sent, or :class:`EvidenceError`."""
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


# ---- comparing ---------------------------------------------------------------------------------

def fail(spec: dict[str, Any], detail: str) -> str:
    """A failed check's message: what was checked, the detail, and the hint, in the spec's language."""
    msg = f"{spec.get('what') or 'check'}: {messages.say(detail, spec.get('lang'))}"
    if spec.get("hint"):
        msg += f"\n  {LANGUAGES[spec['lang']].hint if spec.get('lang') in LANGUAGES else 'Hint'}: {spec['hint']}"
    return msg


def _number(v: Any) -> bool:
    return isinstance(v, (int, float))


def _close(actual: Any, expected: Any, rtol: float | None, atol: float | None, path: str = "") -> str | None:
    """Why ``actual`` is not close to ``expected`` (None: it is), as torch.testing.assert_close would."""
    where = f" at {path}" if path else ""
    if isinstance(expected, Tensor):
        if not isinstance(actual, Tensor):
            return f"expected a torch.Tensor{where}, got {_kind(actual)}"
        if actual.shape != expected.shape:
            return f"shape {actual.shape} but expected {expected.shape}{where}"
        if actual.dtype != expected.dtype:
            return f"dtype torch.{actual.dtype} but expected torch.{expected.dtype}{where}"
        if expected.array is None or actual.array is None:
            return None if expected.array is None and actual.array is None else f"values missing{where}"
        r, a = TOLERANCES.get(expected.dtype, (0.0, 0.0))
        r, a = (r if rtol is None else rtol), (a if atol is None else atol)
        return _array_close(actual.array, expected.array, r, a, where)
    if _number(expected):
        if not _number(actual):
            return f"expected a number{where}, got {_kind(actual)}"
        r, a = PY_FLOAT if isinstance(expected, float) or isinstance(actual, float) else (0.0, 0.0)
        r, a = (r if rtol is None else rtol), (a if atol is None else atol)
        return _array_close(np.asarray(float(actual)), np.asarray(float(expected)), r, a, where, scalar=True)
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)):
            return f"expected a sequence{where}, got {_kind(actual)}"
        if len(actual) != len(expected):
            return f"length {len(actual)} but expected {len(expected)}{where}"
        for i, (x, y) in enumerate(zip(actual, expected)):
            why = _close(x, y, rtol, atol, f"{path}[{i}]")
            if why:
                return why
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"expected a mapping{where}, got {_kind(actual)}"
        if set(actual) != set(expected):
            return f"keys {sorted(map(repr, actual))} but expected {sorted(map(repr, expected))}{where}"
        for k in expected:
            why = _close(actual[k], expected[k], rtol, atol, f"{path}[{k!r}]")
            if why:
                return why
        return None
    return None if _equal(actual, expected) else f"expected {expected!r}, got {actual!r}{where}"


def _array_close(x: np.ndarray, y: np.ndarray, rtol: float, atol: float, where: str, scalar: bool = False) -> str | None:
    if x.dtype.kind == "c" or y.dtype.kind == "c":
        diff = np.abs(x - y)
        ok = diff <= atol + rtol * np.abs(y)
    else:
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(x64 - y64)
            ok = (diff <= atol + rtol * np.abs(y64)) | (x64 == y64)  # x == y: equal infinities
        ok &= ~(np.isnan(x64) | np.isnan(y64))  # NaN is never close, as assert_close's default
    if bool(np.all(ok)):
        return None
    bad = int((~ok).sum())
    finite = np.where(np.isfinite(diff), diff, np.inf)
    worst = np.unravel_index(int(np.argmax(finite)), finite.shape) if finite.ndim else ()
    if scalar:
        return (f"values differ (Scalars are not close!; Expected {float(y):.6g} but got {float(x):.6g}; "
                f"Absolute difference: {float(diff):.3g} (up to {atol:g} allowed); "
                f"Relative difference: {float(diff) / max(abs(float(y)), 1e-300):.3g} (up to {rtol:g} allowed)){where}")
    return (f"values differ (Tensor-likes are not close!; Mismatched elements: {bad} / {ok.size} "
            f"({100 * bad / ok.size:.1f}%); Greatest absolute difference: {float(finite[worst]):.3g} at index "
            f"{tuple(int(i) for i in worst)} (up to {atol:g} allowed)){where}")


def _kind(v: Any) -> str:
    return {Tensor: "Tensor", Raised: "an exception"}.get(type(v), type(v).__name__ if not isinstance(v, Other) else v.type)


def _equal(a: Any, b: Any) -> bool:
    """Python's ``==`` on decoded values (all built by the grader), NaN never equal."""
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False


def verdict(spec: dict[str, Any], actual: Any, expected: Any = None) -> str | None:
    """Why the check ``spec`` fails for ``actual`` (None: it passes).

    Args:
        spec: the check as the reference kernel sent it: ``kind`` (true, equal, close, shape,
            between, ratio, raises, rule) and its parameters, ``what`` and ``hint``.
        actual: the student's decoded value.
        expected: the reference's decoded expected value: the visible test's literal if it gave
            one, else the solution's value of the same check (for a rule, the solution's value).
    """
    kind = spec.get("kind")
    if kind == "true":
        return None if actual is True else fail(spec, "check failed")
    if kind == "equal":
        if isinstance(expected, Tensor) or isinstance(actual, Tensor):
            ok = isinstance(actual, Tensor) and isinstance(expected, Tensor) and actual == expected
        else:
            ok = _equal(actual, expected) and _same_container(actual, expected)
        return None if ok else fail(spec, _difference(actual, expected))
    if kind == "close":
        why = _close(actual, expected, spec.get("rtol"), spec.get("atol"))
        return None if why is None else fail(spec, why)
    if kind == "shape":
        if not isinstance(actual, Tensor):
            return fail(spec, f"expected a torch.Tensor, got {_kind(actual)}")
        shape = tuple(expected) if isinstance(expected, (list, tuple)) else expected
        return None if actual.shape == shape else fail(spec, f"shape {actual.shape} but expected {shape}")
    if kind == "between":
        return _between(spec, actual)
    if kind == "ratio":
        return _ratio(spec, actual)
    if kind == "raises":
        return _raises(spec, actual)
    if kind == "rule":
        params = decode(spec.get("params") if spec.get("params") is not None else {"$dict": []})
        if not isinstance(params, dict) or not all(isinstance(k, str) and k.isidentifier() for k in params):
            return fail(spec, "the check's parameters could not be read")
        why = rules.judge(str(spec.get("rule")), actual, expected, **params)
        return None if why is None else fail(spec, why)
    return fail(spec, f"the grader does not know the check {str(kind)[:40]!r}")


def _short(v: Any, limit: int = 300) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + " ..."


def _difference(actual: Any, expected: Any, path: str = "") -> str:
    """Where two unequal values first differ: ``at [3]['a']: expected 'x', got 'y'``, or the whole
    values when they are small or of different kinds."""
    here = f"at {path}: " if path else ""
    if isinstance(expected, dict) and isinstance(actual, dict) and set(expected) == set(actual):
        for k in expected:
            if not (_equal(actual[k], expected[k]) and _same_container(actual[k], expected[k])):
                return _difference(actual[k], expected[k], f"{path}[{k!r}]")
    seq = (list, tuple, Container)
    if isinstance(expected, seq) and isinstance(actual, seq) and len(actual) == len(expected):
        for i, (x, y) in enumerate(zip(actual, expected)):
            if not (_equal(x, y) and _same_container(x, y)):
                return _difference(x, y, f"{path}[{i}]")
    if _equal(actual, expected) and not _same_container(actual, expected):
        return f"{here}expected a {_kind_of(expected)}, got a {_kind_of(actual)} ({_short(actual)})"
    return f"{here}expected {_short(expected)}, got {_short(actual)}"


def _kind_of(v: Any) -> str:
    return v.type if isinstance(v, Container) else type(v).__name__


def _same_container(a: Any, b: Any) -> bool:
    """Container types as strict as Python's ``==`` is loose: a namedtuple or a tuple subclass must
    come back as itself, and the same holds for every member."""
    if isinstance(b, Container):
        return isinstance(a, Container) and a.type == b.type and all(_same_container(x, y) for x, y in zip(a, b))
    if isinstance(b, (list, tuple)):
        return type(a) is type(b) and all(_same_container(x, y) for x, y in zip(a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and all(_same_container(a[k], b[k]) for k in b if k in a)
    return True


def _value(v: Any) -> float | None:
    if _number(v):
        return float(v)
    if isinstance(v, Tensor) and v.array is not None and v.array.size == 1 and v.array.dtype.kind in "fiub":
        return float(v.array.reshape(()))
    return None


def _between(spec: dict[str, Any], actual: Any) -> str | None:
    v = _value(actual)
    if v is None:
        return fail(spec, f"expected a number, got {_kind(actual)}")
    if v != v:
        return fail(spec, "got NaN")
    lo, hi = spec.get("lo"), spec.get("hi")
    if lo is not None and v < lo:
        return fail(spec, f"{v:.4g} is below the minimum {lo:.4g}")
    if hi is not None and v > hi:
        return fail(spec, f"{v:.4g} is above the maximum {hi:.4g}")
    return None


def _ratio(spec: dict[str, Any], actual: Any) -> str | None:
    if not isinstance(actual, (list, tuple)) or len(actual) != 2:
        return fail(spec, "expected a value and its baseline")
    value, baseline = _value(actual[0]), _value(actual[1])
    if value is None or baseline is None or value != value or baseline != baseline:
        return fail(spec, f"expected two numbers, got {actual!r}")
    if baseline <= 0:
        return fail(spec, f"the baseline must be positive, got {baseline!r}")
    ratio = value / baseline
    lo, hi = spec.get("at_least"), spec.get("at_most")
    if lo is not None and ratio < lo:
        return fail(spec, f"ratio {ratio:.2f}x, needs at least {lo:.2f}x ({value:.4g} vs baseline {baseline:.4g})")
    if hi is not None and ratio > hi:
        return fail(spec, f"ratio {ratio:.2f}x, needs at most {hi:.2f}x ({value:.4g} vs baseline {baseline:.4g})")
    return None


def _raises(spec: dict[str, Any], actual: Any) -> str | None:
    wanted = [t for t in spec.get("types", []) if isinstance(t, str)]
    names = " or ".join(wanted) or "an exception"
    if not isinstance(actual, Raised):
        return fail(spec, f"expected {names}, but nothing was raised")
    if not any(t in actual.types for t in wanted):
        got = actual.types[0] if actual.types else "an exception"
        return fail(spec, f"expected {names}, got {got}: {actual.message[:500]}")
    match = spec.get("match")
    if match and str(match).lower() not in actual.message.lower():
        return fail(spec, f"raised {actual.types[0]} but its message does not mention {match!r}: {actual.message[:500]}")
    return None
