"""Rules for measured checks (``grading.check_measured``) that any lab can name.

Each judges the :class:`~gpulab.verdict.rules.Measurement` list of the student's runs (``mine``)
against bounds given by the check (its contract), and, where a bound is relative, against the
reference run's runs (``ref``; None interactively, where only absolute bounds apply). A busy
machine only adds to a measurement, so each rule reads the least of the runs.

- ``measure.wall``: the work's elapsed time between ``floor_s`` (the modelled device time it must
  wait for: less means the work was not done) and ``at_most_s`` (what the lesson's fix allows).
  Use it only for work whose cost is modelled device time (sleeps, a simulated accelerator,
  stalling reads), which a busy CPU does not stretch.
- ``measure.count``: a counter (``read_calls``, ``read_chars``, ``read_bytes``, ``cpu_s``) at most
  ``at_most`` and at most ``factor`` times the reference run's.
"""

from __future__ import annotations

from typing import Any

from gpulab.verdict.rules import Measurement, least, rule

COUNTERS = ("read_calls", "read_chars", "read_bytes", "write_chars", "cpu_s")


def _runs(mine: Any) -> list[Measurement]:
    if not isinstance(mine, list) or not mine or not all(isinstance(m, Measurement) for m in mine):
        raise ValueError("a measured check's rule needs the grader's measurements")
    return mine


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


@rule("measure.wall")
def wall(mine: Any, ref: Any, *, floor_s: float | None = None, at_most_s: float | None = None,
         why: str = "") -> str | None:
    """Elapsed time within ``[0.95 floor_s, at_most_s]`` (``why``: what a slow run means, for the message)."""
    t = least(_runs(mine), "wall_s")
    if floor_s is not None and t < 0.95 * float(floor_s):
        return (f"a run took {_ms(t)}, less than the {_ms(float(floor_s))} of device work it must wait for: "
                "the work was not done as written")
    if at_most_s is not None and t > float(at_most_s):
        return f"the fastest run took {_ms(t)}, more than the {_ms(float(at_most_s))} allowed" + (f": {why}" if why else "")
    return None


@rule("measure.count")
def count(mine: Any, ref: Any, *, counter: str, at_most: float | None = None, factor: float | None = None,
          why: str = "") -> str | None:
    """``counter`` at most ``at_most``, and at most ``factor`` x the reference run's (when there is one)."""
    if counter not in COUNTERS:
        raise ValueError(f"no counter {counter!r}; the grader measures {', '.join(COUNTERS)}")
    got = least(_runs(mine), counter)
    tail = f": {why}" if why else ""
    if at_most is not None and got > float(at_most):
        return f"{counter} was {got:.4g}, more than the {float(at_most):.4g} allowed{tail}"
    if factor is not None and ref is not None:
        bar = float(factor) * least(_runs(ref), counter)
        if got > bar:
            return f"{counter} was {got:.4g}, more than {float(factor):g} x the reference's ({bar:.4g}){tail}"
    return None
