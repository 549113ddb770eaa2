"""Rules on plain numbers that any lab can name: the contract's bounds, applied by the grader.

- ``bounds.ratio``: the student's value is a pair ``[numerator, denominator]`` (counts, bytes,
  trial-epochs the test took from the student's work) and their ratio must lie within
  ``[at_least, at_most]``. The grader divides; the kernel only sends the two numbers.
- ``bounds.at_most_reference``: the student's number is at most ``factor`` times the reference
  run's value of the same check, plus ``slack`` (for costs the solution sets the bar for: bytes
  kept alive, bytes read). Interactively there is no reference, and only ``at_most`` applies.
"""

from __future__ import annotations

import math
from typing import Any

from gpulab.verdict.rules import rule


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise ValueError(f"{what} must be a finite number, got {type(v).__name__}")
    return float(v)


@rule("bounds.ratio")
def ratio(mine: Any, ref: Any, *, at_least: float | None = None, at_most: float | None = None) -> str | None:
    """``mine[0] / mine[1]`` within ``[at_least, at_most]`` (either may be None)."""
    if not isinstance(mine, (list, tuple)) or len(mine) != 2:
        return f"expected a pair [numerator, denominator], got {type(mine).__name__}"
    num, den = _number(mine[0], "the numerator"), _number(mine[1], "the denominator")
    if den <= 0:
        return f"the denominator is {den:.4g}: nothing to compare against"
    r = num / den
    if at_least is not None and r < float(at_least):
        return f"{num:.4g} / {den:.4g} = {r:.3g}, below the {float(at_least):.3g} required"
    if at_most is not None and r > float(at_most):
        return f"{num:.4g} / {den:.4g} = {r:.3g}, above the {float(at_most):.3g} allowed"
    return None


@rule("bounds.at_most_reference")
def at_most_reference(mine: Any, ref: Any, *, factor: float = 1.0, slack: float = 0.0,
                      at_most: float | None = None) -> str | None:
    """``mine <= factor * ref + slack`` (and ``mine <= at_most`` when given)."""
    got = _number(mine, "the value")
    if at_most is not None and got > float(at_most):
        return f"{got:.6g}, more than the {float(at_most):.6g} allowed"
    if ref is not None:
        bar = float(factor) * _number(ref, "the reference's value") + float(slack)
        if got > bar:
            return f"{got:.6g}, more than the {bar:.6g} the model answer allows"
    return None
