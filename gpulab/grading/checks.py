"""Checks for the notebooks' graded test cells: one call, three behaviours.

Each ``check_*`` takes what the student's code produced, with a ``what`` (what is checked) and a
``hint`` (where to look). What it does depends on where the cell runs
(:func:`gpulab.evidence.wire.mode`):

- **interactively** (Run All, Validate, ``make check``) it compares with the ``expected`` value
  written in the visible test and raises :class:`GradingError` (an ``AssertionError``, so
  nbgrader scores the cell zero) with a message that says what was checked, what came out, and
  the hint;
- in the **student's graded kernel** it only sends the student's value to the grader; nothing
  there holds, computes or receives the answer;
- in the **reference kernel** (the lab's source notebook, run once per ``make grade``) it sends
  the check itself and the solution's value: **that value is the expected one**. A visible test's
  literal ``expected`` is sent too, and the solution is held to it.

A hidden test therefore names no expected value at all: it runs the student's code on inputs from
this run's seed and sends what came out, and the same line, run against the solution in the
reference kernel, gives the other side::

    grading.check_equal(to_device(batch, meta), what="random nested batch moved to meta")

Where several answers are right (a placement, a schedule), :func:`check_rule` names a rule of
:mod:`gpulab.verdict` that the grader applies to both sides. The grader decides in its own
process with :func:`gpulab.verdict.check.verdict`, the function that decides here interactively,
so the messages are the same everywhere.
"""

from __future__ import annotations

from typing import Any, Callable

from gpulab.evidence import wire
from gpulab.evidence.codec import decode, encode
from gpulab.evidence.records import Check
from gpulab.evidence.wire import GRADED, INTERACTIVE, REFERENCE
from gpulab.i18n import messages
from gpulab.verdict import check as judge
from gpulab.verdict import rules

__all__ = ["GradingError", "check", "check_equal", "check_close", "check_shape", "check_between", "check_rule",
           "check_raises", "catch", "NOT_GIVEN"]


class GradingError(AssertionError):
    """A failed check; the message is written for the student."""


class _NotGiven:
    """No expected value in the test: the reference run's value of the same check is the expected one."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()


def interactive_expected(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` when the student runs a visible test (Run All, Validate), so that the
    check can answer at once; under the grader, :data:`NOT_GIVEN` without calling ``fn``.

    For visible tests only (the audit refuses it in a hidden test). Graded, the check's arguments
    hold no expected value and nothing that yields one: the reference run's solution gives it.
    """
    return fn(*args, **kwargs) if wire.mode() == INTERACTIVE else NOT_GIVEN


def _raise(spec: dict[str, Any], why: str | None) -> None:
    if why:
        raise GradingError(why)


def _check(spec: dict[str, Any], actual: Callable[[], Any], expected: Any = NOT_GIVEN) -> None:
    """Send or decide one check. ``actual`` is a thunk: :func:`check_shape` sends less than the value."""
    m = wire.mode()
    if m == GRADED:  # the student's value, and nothing else: the expected side is not here
        wire.emit(Check(actual()))
        return
    value = actual()
    if m == REFERENCE:  # the solution's value is the expected one; a literal of the test is kept beside it
        wire.emit(Check(value, spec) if expected is NOT_GIVEN else Check(value, spec, encode(expected)))
        return
    if expected is NOT_GIVEN:  # a hidden test run interactively (the source): nothing to compare with here
        return
    spec = messages.localize(spec, messages.student_lang())
    _raise(spec, judge.verdict(spec, decode(value), decode(encode(expected))))


def _spec(kind: str, what: str, hint: str, **params: Any) -> dict[str, Any]:
    return {"kind": kind, "what": str(what), "hint": str(hint), **{k: v for k, v in params.items() if v is not None}}


def check(condition: Any, what: str, hint: str = "") -> None:
    """A visible guard for the student: ``condition`` must be true, interactively.

    It is never evidence: under the grader it sends nothing and decides nothing (a boolean the
    kernel computed proves nothing), so a cell's points always rest on value checks beside it.
    """
    if wire.mode() == INTERACTIVE and not condition:
        raise GradingError(judge.verdict(messages.localize(_spec("true", what, hint), messages.student_lang()), False))


def check_equal(actual: Any, expected: Any = NOT_GIVEN, *, what: str, hint: str = "") -> None:
    """Exact equality of plain values (numbers, strings, lists, dicts, tensors, dtypes).

    ``expected`` only in a visible test; a hidden test leaves it out (see the module doc)."""
    _check(_spec("equal", what, hint), lambda: encode(actual), expected)


def check_close(actual: Any, expected: Any = NOT_GIVEN, *, what: str, rtol: float | None = None,
                atol: float | None = None, hint: str = "") -> None:
    """Tensors or numbers (or lists and dicts of them) close within tolerance, as
    ``torch.testing.assert_close`` would say (dtype and shape differences are named first)."""
    _check(_spec("close", what, hint, rtol=rtol, atol=atol), lambda: encode(actual), expected)


def check_shape(tensor: Any, shape: Any = NOT_GIVEN, *, what: str, hint: str = "") -> None:
    """``tensor`` is a tensor of this shape (only its dtype, shape and device are sent)."""
    def described() -> Any:
        torch = __import__("sys").modules.get("torch")
        if torch is not None and isinstance(tensor, torch.Tensor):
            return {"$tensor": {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                                "device": "meta", "data": None}}
        return encode(tensor)

    _check(_spec("shape", what, hint), described, shape if shape is NOT_GIVEN else tuple(shape))


def check_between(value: float, lo: float | None, hi: float | None, *, what: str, hint: str = "") -> None:
    """``lo <= value <= hi`` (either bound may be None): the bounds are the contract, given in the
    test and taken by the grader from the reference run's."""
    m = wire.mode()
    lo_, hi_ = (None, None) if m == GRADED else (lo, hi)
    _check(_spec("between", what, hint, lo=_float(lo_), hi=_float(hi_)), lambda: encode(value),
           NOT_GIVEN if m != INTERACTIVE else None)


def check_rule(value: Any, rule: str, *, what: str, hint: str = "", **params: Any) -> None:
    """``value`` keeps the rule ``rule`` of :mod:`gpulab.verdict` (``"lab00.placement"``), judged by
    the grader against the reference run's value of the same check: for answers that may rightly
    differ from the solution's. ``params`` (plain values) go to the rule with the reference's check.

    Interactively the rule sees no reference (``ref=None``) and judges what it can alone."""
    m = wire.mode()
    spec = _spec("rule", what, hint, rule=str(rule), params=encode(params) if m != GRADED else None)
    if m != INTERACTIVE:
        wire.emit(Check(encode(value), spec if m == REFERENCE else None))
        return
    spec = messages.localize(spec, messages.student_lang())
    why = rules.judge(rule, decode(encode(value)), None, **params)
    _raise(spec, None if why is None else judge.fail(spec, why))


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
    in the graded kernel, where nothing stops the cell). The exception types and ``match`` are the
    contract; under the grader they come from the reference run's check."""
    try:
        fn(*args, **kwargs)
        raised = None
    except Exception as err:  # the exception is the evidence
        raised = err
    m = wire.mode()
    spec = _spec("raises", what, hint, types=_names(exc_type) if m != GRADED else None,
                 match=match if m != GRADED else None)
    _check(spec, lambda: encode(raised), NOT_GIVEN if m != INTERACTIVE else None)
    return raised
