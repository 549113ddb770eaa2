"""Checks for the notebooks' graded test cells.

Every helper raises :class:`GradingError` (an ``AssertionError``, so nbgrader scores the cell
zero) with a message that says what was checked, what came out, and where to look. Timing checks
are *ratios* against a baseline measured in the same run, so a grade does not depend on how fast
the grading machine is.

Example (a test cell)::

    from gpulab import grading
    grading.check_close(my_normalize(x), reference, what="normalised batch",
                        hint="subtract the mean before dividing by std")
    grading.check_not_calling(my_normalize, x, forbidden=[gpulab.data.loading.to_device_normalize])
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any, Callable, Iterable, Sequence

import torch

from gpulab.profiling.interleave import SpeedComparison, compare_speed

__all__ = [
    "GradingError",
    "check",
    "check_equal",
    "check_close",
    "check_shape",
    "check_between",
    "check_ratio",
    "check_raises",
    "catch",
    "check_not_calling",
    "compare_speed",
    "SpeedComparison",
]


class GradingError(AssertionError):
    """A failed check; the message is written for the student."""


def _fail(what: str, detail: str, hint: str = "") -> None:
    msg = f"{what}: {detail}"
    if hint:
        msg += f"\n  Hint: {hint}"
    raise GradingError(msg)


def check(condition: Any, what: str, hint: str = "") -> None:
    """Fail with ``what`` (and ``hint``) unless ``condition`` is truthy."""
    if not condition:
        _fail(what, "check failed", hint)


def check_equal(actual: Any, expected: Any, *, what: str, hint: str = "") -> None:
    """Exact equality for plain values (ints, strings, lists, dicts)."""
    if actual != expected:
        _fail(what, f"expected {expected!r}, got {actual!r}", hint)


def check_close(
    actual: Any,
    expected: Any,
    *,
    what: str,
    rtol: float | None = None,
    atol: float | None = None,
    hint: str = "",
) -> None:
    """Tensors (or numbers) close within tolerance, compared by ``torch.testing.assert_close``.

    Dtype and device differences are reported as such, before the values are compared, because a
    student who returns float64 or a tensor on the wrong device needs that message, not a
    value mismatch.
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            _fail(what, f"expected a torch.Tensor, got {type(actual).__name__}", hint)
        if actual.shape != expected.shape:
            _fail(what, f"shape {tuple(actual.shape)} but expected {tuple(expected.shape)}", hint)
        if actual.dtype != expected.dtype:
            _fail(what, f"dtype {actual.dtype} but expected {expected.dtype}", hint)
        actual, expected = actual.detach().cpu(), expected.detach().cpu()
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, check_device=False)
    except AssertionError as err:
        first = str(err).strip().splitlines()
        _fail(what, "values differ (" + "; ".join(first[:3]) + ")", hint)
    except (TypeError, ValueError) as err:
        _fail(what, f"cannot compare {type(actual).__name__} with {type(expected).__name__}: {err}", hint)


def check_shape(tensor: Any, shape: Sequence[int], *, what: str, hint: str = "") -> None:
    """``tensor.shape`` equals ``shape``."""
    if not isinstance(tensor, torch.Tensor):
        _fail(what, f"expected a torch.Tensor, got {type(tensor).__name__}", hint)
    if tuple(tensor.shape) != tuple(shape):
        _fail(what, f"shape {tuple(tensor.shape)} but expected {tuple(shape)}", hint)


def check_between(value: float, lo: float | None, hi: float | None, *, what: str, hint: str = "") -> None:
    """``lo <= value <= hi`` (either bound may be None)."""
    if value != value:  # NaN
        _fail(what, "got NaN", hint)
    if lo is not None and value < lo:
        _fail(what, f"{value:.4g} is below the minimum {lo:.4g}", hint)
    if hi is not None and value > hi:
        _fail(what, f"{value:.4g} is above the maximum {hi:.4g}", hint)


def check_ratio(
    value: float,
    baseline: float,
    *,
    what: str,
    at_least: float | None = None,
    at_most: float | None = None,
    hint: str = "",
) -> None:
    """Check ``value / baseline`` against a bound (the failure message gives the ratio).

    Both numbers must come from the same run on the same machine (for example two throughputs
    measured one after the other), so the check holds on a laptop and on a server alike.
    """
    if baseline <= 0:
        _fail(what, f"the baseline must be positive, got {baseline!r}", "measure the baseline first")
    ratio = value / baseline
    if at_least is not None and ratio < at_least:
        _fail(what, f"ratio {ratio:.2f}x, needs at least {at_least:.2f}x ({value:.4g} vs baseline {baseline:.4g})", hint)
    if at_most is not None and ratio > at_most:
        _fail(what, f"ratio {ratio:.2f}x, needs at most {at_most:.2f}x ({value:.4g} vs baseline {baseline:.4g})", hint)


def check_raises(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    fn: Callable[..., Any],
    *args: Any,
    what: str,
    match: str | None = None,
    hint: str = "",
    **kwargs: Any,
) -> None:
    """``fn(*args, **kwargs)`` raises ``exc_type`` (whose message contains ``match``).

    Returns None, like every ``check_*``: a test cell that ends with a check shows no ``Out[]``
    (an exception object there reads as a failure, and nbgrader tries to read it as a score).
    Use :func:`catch` to look at the exception itself.
    """
    catch(exc_type, fn, *args, what=what, match=match, hint=hint, **kwargs)


def catch(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    fn: Callable[..., Any],
    *args: Any,
    what: str,
    match: str | None = None,
    hint: str = "",
    **kwargs: Any,
) -> BaseException:
    """Like :func:`check_raises`, and return the exception to check further (its ``__cause__``...)."""
    names = exc_type.__name__ if isinstance(exc_type, type) else " or ".join(t.__name__ for t in exc_type)
    try:
        fn(*args, **kwargs)
    except exc_type as err:
        if match is not None and match.lower() not in str(err).lower():
            _fail(what, f"raised {type(err).__name__} but its message does not mention {match!r}: {err}", hint)
        return err
    except Exception as err:  # noqa: BLE001 - reported to the student
        _fail(what, f"expected {names}, got {type(err).__name__}: {err}", hint)
    _fail(what, f"expected {names}, but nothing was raised", hint)
    raise AssertionError("unreachable")


# --- "did the student write it, or call ours?" -------------------------------------------------

def _code_objects(obj: Any) -> set[Any]:
    """Code objects of a function, a bound method, or every method defined on a class."""
    # decorators that keep ``__wrapped__`` (functools.wraps, @contextmanager) share their wrapper's code
    # with every function they decorate, the student's too: the reference's own code is the wrapped one
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    if hasattr(obj, "__code__"):
        return {obj.__code__}
    if isinstance(obj, type):
        codes = set()
        for klass in obj.__mro__:
            # Python's and torch's own bases (object, typing.Generic under torch's Dataset and Sampler)
            # are shared with every student class: only the reference's own methods are forbidden
            if klass.__module__ in ("builtins", "typing", "abc") or klass.__module__.startswith("torch"):
                continue
            for member in vars(klass).values():
                member = getattr(member, "__func__", member)
                if isinstance(member, property):
                    member = member.fget
                if callable(member):
                    member = inspect.unwrap(member)
                if hasattr(member, "__code__"):
                    codes.add(member.__code__)
        return codes
    return set()


def _qualname(obj: Any) -> str:
    obj = getattr(obj, "__func__", obj)
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def code_key(code: Any) -> tuple:
    """What a code object *does*: its bytecode, constants (nested code objects by their own key)
    and the names it uses; not its name, file or line. A copy of a reference (``exec`` of its
    source, ``types.FunctionType(ref.__code__, ...)``, ``code.replace(co_name=...)``) has the same
    key, so it is caught as the reference it is."""
    consts = tuple(code_key(c) if hasattr(c, "co_code") else (type(c).__name__, repr(c)) for c in code.co_consts)
    return (code.co_code, consts, code.co_names)


def _distinctive(code: Any) -> bool:
    """Whether a copy of ``code`` can be told from a student's own: it carries a docstring, or is
    long enough. (``def __len__(self): return self.n`` is written the same by everyone; only the
    very object counts for such code.)"""
    return bool(code.co_consts and isinstance(code.co_consts[0], str)) or len(code.co_code) >= 128


# Calls that switch the profiler (and with it this check) off; their ``c_call`` event reaches the
# profiler before they take effect.
_PROFILER_SWITCHES = ("setprofile", "settrace", "setprofile_all_threads", "settrace_all_threads")


def _switches_profiler(fn: Any) -> bool:
    return getattr(fn, "__self__", None) is sys and getattr(fn, "__name__", "") in _PROFILER_SWITCHES


def check_not_calling(
    fn: Callable[..., Any],
    *args: Any,
    forbidden: Iterable[Any],
    what: str | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` and fail if it reaches any ``forbidden`` reference.

    The references are gpulab's own implementations of the exercise. Calls are traced with
    ``sys.setprofile`` in this thread and ``threading.setprofile`` in threads started meanwhile,
    so aliases (``from gpulab... import X as mine``) and calls from helpers are caught too. Code
    is compared by content (:func:`code_key`; for a reference with a docstring or of some length),
    so a copy of a reference counts as the reference, and turning the profiler off
    (``sys.setprofile(None)``) while the check runs fails it.

    What it does not catch: a student who reads the reference's source (gpulab is installed
    with the labs) and retypes it, renamed or reordered, writes code that is the student's own as
    far as any program can tell; that passes. So do calls from a thread started before the check
    and from another process, which the profiler does not see. Those are left to a human reading
    the submission (docs/instructor.md, "Threat model").

    Returns:
        Whatever ``fn`` returned, so the caller can go on checking the result.
    """
    targets: dict[Any, str] = {}  # the code objects themselves, and the content of distinctive ones
    for ref in forbidden:
        for code in _code_objects(ref):
            targets[code] = _qualname(ref)
            if _distinctive(code):
                targets[code_key(code)] = _qualname(ref)
    hits: list[str] = []
    seen: dict[int, tuple[Any, str | None]] = {}  # id(code) -> (code, hit); the code is kept so ids stay unique

    def tracer(frame, event, arg):  # noqa: ANN001 - profiler signature
        if event == "call":
            code = frame.f_code
            entry = seen.get(id(code))
            if entry is None:
                entry = seen[id(code)] = (code, targets.get(code) or targets.get(code_key(code)))
            if entry[1] is not None:
                hits.append(entry[1])
        elif event == "c_call" and frame is not own and _switches_profiler(arg):
            hits.append(f"sys.{arg.__name__} (which turns this check off)")

    own = sys._getframe()  # this function's own calls below switch the profiler back
    old = sys.getprofile()
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        result = fn(*args, **kwargs)
    finally:
        still_on = sys.getprofile() is tracer
        sys.setprofile(old)
        threading.setprofile(None)
    if not still_on and not hits:
        hits.append("something that replaced the profiler (which turns this check off)")
    if hits:
        name = what or getattr(fn, "__name__", "your function")
        _fail(
            name,
            f"it calls gpulab's reference {hits[0]}" if "turns this check off" not in hits[0]
            else f"it calls {hits[0]}",
            "the exercise is to write this yourself; use torch operations, not the gpulab reference",
        )
    return result
