"""Checks for the notebooks' graded test cells: one call, three behaviours.

Each ``check_*`` takes what the student's code produced and what is expected, with a ``what``
(what is checked) and a ``hint`` (where to look). What it does depends on where the cell runs
(:func:`gpulab.grading.evidence.mode`):

- **interactively** (Run All, Validate, ``make check``) it compares now and raises
  :class:`GradingError` (an ``AssertionError``, so nbgrader scores the cell zero) with a message
  that says what was checked, what came out, and the hint;
- in the **student's graded kernel** it only sends the student's value to the grader, and decides
  nothing; an expected value given as :func:`~gpulab.grading.evidence.by_reference` is not even
  computed there;
- in the **reference kernel** it sends the check, the expected value and the solution's value.

The grader compares the two in its own process with :func:`gpulab.grading.judge.verdict`, the
same function that decides here interactively, so the messages are the same everywhere.

Example (a test cell)::

    from gpulab import grading
    grading.check_equal(place_ranks(m, 3), ["cuda:0", "cuda:1", "cuda:0"], what="3 ranks, 2 GPUs")
    ### BEGIN HIDDEN TESTS
    m = MachineSpec(grading.rng("m").randint(1, 8), True, True)        # inputs from this run's seed
    grading.check_equal(place_ranks(m, 5), grading.by_reference(ref.place_ranks, m, 5), what=...)
"""

from __future__ import annotations

from typing import Any, Callable

from gpulab.grading import evidence, judge
from gpulab.grading.evidence import GRADED, REFERENCE, by_reference, encode
from gpulab.i18n import messages

__all__ = ["GradingError", "check", "check_equal", "check_close", "check_shape", "check_between", "check_ratio",
           "check_raises", "catch", "by_reference"]


class GradingError(AssertionError):
    """A failed check; the message is written for the student."""


def _check(spec: dict[str, Any], actual: Callable[[], Any], expected: Any = None) -> None:
    """Send or decide one check. ``actual`` is a thunk: :func:`check_shape` sends less than the value."""
    m = evidence.mode()
    if m == GRADED:
        evidence.emit({"kind": "check", "value": actual()})
        return
    value, want = actual(), encode(evidence.resolve(expected))
    if m == REFERENCE:  # the reference kernel does not stop: the grader judges the solution as well
        evidence.emit({"kind": "check", "spec": spec, "value": value, "expected": want})
        return
    why = judge.verdict(messages.localize(spec, messages.student_lang()), judge.decode(value), judge.decode(want))
    if why:
        raise GradingError(why)


def _spec(kind: str, what: str, hint: str, **params: Any) -> dict[str, Any]:
    return {"kind": kind, "what": str(what), "hint": str(hint), **{k: v for k, v in params.items() if v is not None}}


def check(condition: Any, what: str, hint: str = "") -> None:
    """``condition`` must be true.

    Warning:
        The condition is computed in the student's kernel, so on its own it proves nothing to the
        grader: use it beside checks of values against :func:`by_reference`, never alone.
    """
    _check(_spec("true", what, hint), lambda: bool(condition))


def check_equal(actual: Any, expected: Any, *, what: str, hint: str = "") -> None:
    """Exact equality of plain values (numbers, strings, lists, dicts, tensors, dtypes)."""
    _check(_spec("equal", what, hint), lambda: encode(actual), expected)


def check_close(actual: Any, expected: Any, *, what: str, rtol: float | None = None, atol: float | None = None,
                hint: str = "") -> None:
    """Tensors or numbers (or lists and dicts of them) close within tolerance, as
    ``torch.testing.assert_close`` would say (dtype and shape differences are named first)."""
    _check(_spec("close", what, hint, rtol=rtol, atol=atol), lambda: encode(actual), expected)


def check_shape(tensor: Any, shape: Any, *, what: str, hint: str = "") -> None:
    """``tensor`` is a tensor of this shape."""
    def described() -> Any:
        torch = __import__("sys").modules.get("torch")
        if torch is not None and isinstance(tensor, torch.Tensor):
            return {"$tensor": {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                                "device": "meta", "data": None}}
        return encode(tensor)

    _check(_spec("shape", what, hint), described, evidence.Lazy(lambda: tuple(evidence.resolve(shape))))


def check_between(value: float, lo: float | None, hi: float | None, *, what: str, hint: str = "") -> None:
    """``lo <= value <= hi`` (either bound may be None)."""
    m = evidence.mode()
    lo_, hi_ = (None, None) if m == GRADED else (evidence.resolve(lo), evidence.resolve(hi))
    _check(_spec("between", what, hint, lo=_float(lo_), hi=_float(hi_)), lambda: encode(value))


def check_ratio(value: float, baseline: float, *, what: str, at_least: float | None = None,
                at_most: float | None = None, hint: str = "") -> None:
    """``value / baseline`` within bounds (the message gives the ratio).

    Both numbers come from the student's kernel: for a speed, use
    :func:`gpulab.grading.speedup.check_speedup`, which the grader times from its own side.
    """
    _check(_spec("ratio", what, hint, at_least=at_least, at_most=at_most), lambda: encode((value, baseline)))


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _names(exc_type: type[BaseException] | tuple[type[BaseException], ...]) -> list[str]:
    return [exc_type.__name__] if isinstance(exc_type, type) else [t.__name__ for t in exc_type]


def check_raises(exc_type: type[BaseException] | tuple[type[BaseException], ...], fn: Callable[..., Any], *args: Any,
                 what: str, match: str | None = None, hint: str = "", **kwargs: Any) -> None:
    """``fn(*args, **kwargs)`` raises ``exc_type`` (a subclass counts), whose message contains ``match``.

    Returns None, like every ``check_*``: use :func:`catch` to look at the exception itself.
    """
    catch(exc_type, fn, *args, what=what, match=match, hint=hint, **kwargs)


def catch(exc_type: type[BaseException] | tuple[type[BaseException], ...], fn: Callable[..., Any], *args: Any,
          what: str, match: str | None = None, hint: str = "", **kwargs: Any) -> BaseException | None:
    """Like :func:`check_raises`, and return the exception to check further (None if none was raised
    in the graded kernel, where nothing stops the cell)."""
    try:
        fn(*args, **kwargs)
        raised = None
    except Exception as err:  # the exception is the evidence
        raised = err
    _check(_spec("raises", what, hint, types=_names(exc_type), match=match), lambda: encode(raised))
    return raised
