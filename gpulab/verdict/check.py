"""Decide one check from data: the student's decoded value against the reference's, outside any kernel.

The grader (:mod:`gpulab.verdict.cell`) calls :func:`verdict` in its own process with what two
kernels sent (:mod:`gpulab.evidence`): the student's value, and from the reference kernel the check
itself and the expected side. Interactive checks call the same function in the student's kernel,
so a message reads the same in Validate and in the feedback. Plain Python and numpy, no I/O, no
torch; the words of every verdict are :data:`gpulab.i18n.verdict_texts.TEXTS`, written by
:func:`~gpulab.i18n.verdict_texts.text`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpulab.evidence.codec import Container, Other, Raised, Tensor, decode
from gpulab.i18n import LANGUAGES, messages  # a localized spec's language: the hint's label, the verdict
from gpulab.i18n.verdict_texts import text
from gpulab.verdict import rules

# torch.testing.assert_close's default tolerances (rtol, atol) by dtype; other dtypes compare exactly
TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
              "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7)}
PY_FLOAT = (1e-7, 1e-7)


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
    where = text("close.at", path) if path else ""
    if isinstance(expected, Tensor):
        if not isinstance(actual, Tensor):
            return text("close.not_tensor", where, _kind(actual))
        if actual.shape != expected.shape:
            return text("close.shape", actual.shape, expected.shape, where)
        if actual.dtype != expected.dtype:
            return text("close.dtype", actual.dtype, expected.dtype, where)
        if expected.array is None or actual.array is None:
            return None if expected.array is None and actual.array is None else text("close.values_missing", where)
        r, a = TOLERANCES.get(expected.dtype, (0.0, 0.0))
        r, a = (r if rtol is None else rtol), (a if atol is None else atol)
        return _array_close(actual.array, expected.array, r, a, where)
    if _number(expected):
        if not _number(actual):
            return text("close.not_number", where, _kind(actual))
        r, a = PY_FLOAT if isinstance(expected, float) or isinstance(actual, float) else (0.0, 0.0)
        r, a = (r if rtol is None else rtol), (a if atol is None else atol)
        return _array_close(np.asarray(float(actual)), np.asarray(float(expected)), r, a, where, scalar=True)
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)):
            return text("close.not_sequence", where, _kind(actual))
        if len(actual) != len(expected):
            return text("close.length", len(actual), len(expected), where)
        for i, (x, y) in enumerate(zip(actual, expected)):
            why = _close(x, y, rtol, atol, f"{path}[{i}]")
            if why:
                return why
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return text("close.not_mapping", where, _kind(actual))
        if set(actual) != set(expected):
            return text("close.keys", sorted(map(repr, actual)), sorted(map(repr, expected)), where)
        for k in expected:
            why = _close(actual[k], expected[k], rtol, atol, f"{path}[{k!r}]")
            if why:
                return why
        return None
    return None if _equal(actual, expected) else text("close.unequal", repr(expected), repr(actual), where)


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
        return text("close.scalars", f"{float(y):.6g}", f"{float(x):.6g}", f"{float(diff):.3g}", f"{atol:g}",
                    f"{float(diff) / max(abs(float(y)), 1e-300):.3g}", f"{rtol:g}", where)
    return text("close.tensors", bad, ok.size, f"{100 * bad / ok.size:.1f}", f"{float(finite[worst]):.3g}",
                tuple(int(i) for i in worst), f"{atol:g}", where)


def _kind(v: Any) -> str:
    return {Tensor: "Tensor", Raised: text("raises.any")}.get(type(v), type(v).__name__ if not isinstance(v, Other) else v.type)


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
            between, raises, rule) and its parameters, ``what`` and ``hint``.
        actual: the student's decoded value.
        expected: the reference's decoded expected value: the visible test's literal if it gave
            one, else the solution's value of the same check (for a rule, the solution's value).
    """
    kind = spec.get("kind")
    if kind == "true":
        return None if actual is True else fail(spec, text("true.failed"))
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
            return fail(spec, text("shape.not_tensor", _kind(actual)))
        shape = tuple(expected) if isinstance(expected, (list, tuple)) else expected
        return None if actual.shape == shape else fail(spec, text("shape.differs", actual.shape, shape))
    if kind == "between":
        return _between(spec, actual)
    if kind == "raises":
        return _raises(spec, actual)
    if kind == "rule":
        params = decode(spec.get("params") if spec.get("params") is not None else {"$dict": []})
        if not isinstance(params, dict) or not all(isinstance(k, str) and k.isidentifier() for k in params):
            return fail(spec, text("rule.unreadable"))
        why = rules.judge(str(spec.get("rule")), actual, expected, **params)
        return None if why is None else fail(spec, why)
    return fail(spec, text("check.unknown", repr(str(kind)[:40])))


def _short(v: Any, limit: int = 300) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + " ..."


def _difference(actual: Any, expected: Any, path: str = "") -> str:
    """Where two unequal values first differ: ``at [3]['a']: expected 'x', got 'y'``, or the whole
    values when they are small or of different kinds."""
    here = text("equal.at", path) if path else ""
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
        return text("equal.container", here, _kind_of(expected), _kind_of(actual), _short(actual))
    return text("equal.differs", here, _short(expected), _short(actual))


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
        return fail(spec, text("between.not_number", _kind(actual)))
    if v != v:
        return fail(spec, text("between.nan"))
    lo, hi = spec.get("lo"), spec.get("hi")
    if lo is not None and v < lo:
        return fail(spec, text("between.below", f"{v:.4g}", f"{lo:.4g}"))
    if hi is not None and v > hi:
        return fail(spec, text("between.above", f"{v:.4g}", f"{hi:.4g}"))
    return None


def _raises(spec: dict[str, Any], actual: Any) -> str | None:
    wanted = [t for t in spec.get("types", []) if isinstance(t, str)]
    names = " or ".join(wanted) or text("raises.any")
    if not isinstance(actual, Raised):
        return fail(spec, text("raises.nothing", names))
    if not any(t in actual.types for t in wanted):
        got = actual.types[0] if actual.types else text("raises.any")
        return fail(spec, text("raises.other", names, got, actual.message[:500]))
    match = spec.get("match")
    if match and str(match).lower() not in actual.message.lower():
        return fail(spec, text("raises.message", actual.types[0], repr(match), actual.message[:500]))
    return None
