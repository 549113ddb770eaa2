"""A speed-up check that is fair on a loaded machine: the target, or the reference's own figure.

A graded speed-up ("your version is at least 1.3x faster than the baseline, measured side by side")
holds on a machine that gives the work the cores it needs. On a shared machine where other
programs hold those cores, no implementation reaches the target, not even gpulab's reference. The
rule (first written for lab 07's pipeline check, and shared here so that every lab applies the
same one):

1. measure, in the same run: your speed-up, the reference's speed-up, and the cores the
   measurement had (CPU seconds / wall seconds);
2. pass if your speed-up reaches ``at_least``;
3. otherwise, if the measurement had fewer than ``min_cores`` cores (the machine could not show
   the target), pass if your speed-up is at least ``relative`` x the reference's, measured in the
   same run (even when the reference scraped past the target: a correct version slightly behind it
   must not fail on noise);
4. otherwise measure again, up to ``attempts`` times (load comes and goes), then fail with every
   figure measured.

    result = check_speedup(measure, at_least=1.3, what="pipelined vs sequential")
    print(result)   # "yours 1.42x, reference 1.51x (1.93 cores) ...: passed against the target"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from gpulab.grading.checks import GradingError

__all__ = ["SpeedupMeasurement", "SpeedupResult", "check_speedup"]


@dataclass
class SpeedupMeasurement:
    """One side-by-side measurement.

    Attributes:
        yours: the student's speed-up over the baseline (baseline time / your time).
        reference: gpulab's reference speed-up over the same baseline, in the same measurement.
        cores: the cores the measurement had (CPU seconds / wall seconds of the work that needs them).
        detail: free text shown with the figures (e.g. milliseconds per variant).
        times: the seconds behind the ratios, by variant name (for further checks).
    """

    yours: float
    reference: float
    cores: float
    detail: str = ""
    times: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        more = f"; {self.detail}" if self.detail else ""
        return f"yours {self.yours:.2f}x, reference {self.reference:.2f}x ({self.cores:.2f} cores{more})"


@dataclass
class SpeedupResult:
    """What :func:`check_speedup` passed on, and every measurement it made."""

    passed: SpeedupMeasurement
    against_reference: bool  # passed relative to the reference: the machine could not show the target
    tried: list[SpeedupMeasurement] = field(default_factory=list)

    def __str__(self) -> str:
        how = ("relative to the reference (this machine did not give the work the cores it needs)"
               if self.against_reference else "against the target")
        return f"{self.passed}, after {len(self.tried)} measurement(s): passed {how}"


def check_speedup(measure: Callable[[], SpeedupMeasurement], *, at_least: float, what: str,
                  relative: float = 0.85, min_cores: float = 1.6, attempts: int = 3,
                  hint: str = "") -> SpeedupResult:
    """Apply the rule of the module docstring to up to ``attempts`` calls of ``measure``.

    Args:
        measure: makes one side-by-side measurement.
        at_least: the target speed-up.
        what: what is measured, for the message.
        relative: the fraction of the reference's speed-up that passes on a machine short of cores.
        min_cores: below this many cores the target is out of reach and ``relative`` applies
            (``math.inf``: it always applies, for checks that prove the overlap without a clock).
        attempts: measurements before failing.
        hint: where to look, for the failure message.

    Returns:
        The :class:`SpeedupResult` of the measurement that passed.

    Raises:
        GradingError: when no measurement passed (the message gives every figure).
        ValueError: for ``attempts < 1``.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    tried: list[SpeedupMeasurement] = []
    for _ in range(attempts):
        m = measure()
        tried.append(m)
        if m.yours >= at_least:
            return SpeedupResult(m, False, tried)
        if m.cores < min_cores and m.yours >= relative * m.reference:
            return SpeedupResult(m, True, tried)
    figures = "; ".join(str(m) for m in tried)
    when = "" if math.isinf(min_cores) else f" when the machine has fewer than {min_cores:.1f} cores for it"
    msg = (f"{what}: needs at least {at_least:.2f}x (or {relative:.2f} x the reference's speed-up measured in the "
           f"same run{when}); measured {figures}")
    if hint:
        msg += f"\n  Hint: {hint}"
    raise GradingError(msg)
