"""A graded speed-up, timed by whoever can be trusted to hold the clock.

``check_speedup(candidate, baseline, ...)`` names two pieces of work, each ``fn(seed) -> result``:
one unit of the student's faster version and one of the baseline, on inputs drawn from ``seed``.

- **Interactively** (Run All, Validate) they are timed here, interleaved (A B A B ...), and the
  check raises :class:`~gpulab.grading.GradingError` when the candidate is not ``at_least`` times
  faster. On a machine that could not give the work ``min_cores`` cores (another program holds
  one), the ``reference`` workload, gpulab's own version timed in the same run, sets the bar
  instead: ``relative`` x its speed-up.
- **Under the grader** nothing is timed in the student's kernel. The cell only registers the two
  workloads; after the cell, the grader sends one request per run, interleaved, each with a seed
  it reveals only in that request, and times the round trip with its own clock
  (:mod:`gpulab.course.judge`). Every run's result is compared with the reference kernel's
  result for the same seed (work skipped or faked fails), a run faster than ``floor_s`` is
  impossible and fails, and the student's baseline counts at most ``band`` x the reference
  kernel's baseline (a baseline slowed on purpose gains nothing past that). The reference kernel's
  own speed-up, measured on as many cores as the student's kernel gets, is the bar when the
  submission has fewer than ``min_cores`` cores.

    grading.check_speedup(lambda s: step(mine, s), lambda s: step(sequential, s), at_least=1.25,
                          what="pipelined vs sequential micro-batches", reference=lambda s: step(ref, s))
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpulab.devices.physical import synchronize_all
from gpulab.grading import evidence, judge
from gpulab.grading.checks import GradingError

__all__ = ["check_speedup", "SpeedupReport"]

Work = Callable[[int], Any]


@dataclass
class SpeedupReport:
    """What an interactive :func:`check_speedup` measured (median seconds per run)."""

    candidate_s: float
    baseline_s: float
    cores: float
    reference_s: float | None = None
    passed_how: str = ""
    times: dict[str, list[float]] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.baseline_s / max(self.candidate_s, 1e-12)

    @property
    def reference_speedup(self) -> float | None:
        return None if self.reference_s is None else self.baseline_s / max(self.reference_s, 1e-12)

    def __str__(self) -> str:
        ref = f", reference {self.reference_speedup:.2f}x" if self.reference_s is not None else ""
        return (f"yours {self.speedup:.2f}x ({self.candidate_s * 1e3:.1f} ms vs baseline {self.baseline_s * 1e3:.1f} ms"
                f"{ref}, {self.cores:.2f} cores){': ' + self.passed_how if self.passed_how else ''}")


class TimedByGrader:
    """What a graded kernel gets back: the timing happens after the cell, from the grader's side."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __str__(self) -> str:
        return f"{self.what}: timed by the grader after this cell"


def _time(work: Work, seed: int) -> tuple[float, float]:
    # timed_call's rule, written here: importing gpulab.profiling would load its whole package into
    # every graded kernel, whose memory limit lab 00's class fixture holds it to
    synchronize_all()
    c0, t0 = time.process_time(), time.perf_counter()
    work(seed)
    synchronize_all()  # queued GPU work counts
    return time.perf_counter() - t0, time.process_time() - c0


def check_speedup(candidate: Work, baseline: Work, *, what: str, at_least: float, repeats: int = 3,
                  relative: float = 0.85, min_cores: float = 1.6, band: float = 1.25, floor_s: float | None = None,
                  rtol: float | None = 1e-4, atol: float | None = 1e-5, reference: Work | None = None,
                  hint: str = "", warmup: int = 1) -> SpeedupReport | TimedByGrader:
    """``candidate`` must run ``at_least`` times faster than ``baseline`` (see the module doc).

    Args:
        candidate, baseline: one unit of work each, ``fn(seed) -> result``; the result (a loss,
            a few numbers, a small tensor) is what the grader compares with the reference run's,
            within ``rtol``/``atol`` (``None`` results are not compared).
        what, hint: for the message.
        at_least: the target speed-up (ratio of median times).
        repeats: timed runs of each, interleaved, after ``warmup`` untimed ones.
        relative, min_cores: the bar on a machine short of cores (see the module doc).
        band: how much slower than the reference run's baseline the student's may count.
        floor_s: the least time one honest candidate run can take (device work it must wait for).
        reference: gpulab's version of the candidate, timed interactively for the low-core bar.

    Returns:
        Interactively, the :class:`SpeedupReport`; under the grader, a placeholder.

    Raises:
        GradingError: interactively, when the candidate is not fast enough.
        ValueError: for ``repeats < 1`` or ``at_least <= 0``.
    """
    if repeats < 1 or at_least <= 0:
        raise ValueError(f"repeats must be >= 1 and at_least > 0, got {repeats} and {at_least}")
    m = evidence.mode()
    if m != evidence.INTERACTIVE:
        ident = evidence.register_timed({"candidate": candidate, "baseline": baseline})
        record: dict[str, Any] = {"kind": "timed", "id": ident}
        if m == evidence.REFERENCE:
            record["spec"] = {"what": what, "hint": hint, "at_least": at_least, "repeats": repeats,
                              "relative": relative, "min_cores": min_cores, "band": band, "floor_s": floor_s,
                              "rtol": rtol, "atol": atol, "warmup": warmup}
        evidence.emit(record)
        return TimedByGrader(what)
    seeds = random.Random(evidence.seed()).sample(range(2**30), 2 * (repeats + warmup))
    for i in range(warmup):
        baseline(seeds[2 * i])
        candidate(seeds[2 * i + 1])
    times: dict[str, list[float]] = {"baseline": [], "candidate": []}
    cpu = 0.0
    for i in range(warmup, warmup + repeats):
        order = [("baseline", baseline, seeds[2 * i]), ("candidate", candidate, seeds[2 * i + 1])]
        for name, work, s in order if i % 2 == 0 else order[::-1]:
            wall, used = _time(work, s)
            times[name].append(wall)
            cpu += used if name == "candidate" else 0.0
    report = SpeedupReport(statistics.median(times["candidate"]), statistics.median(times["baseline"]),
                           cpu / max(sum(times["candidate"]), 1e-12), times=times)
    if report.speedup >= at_least:
        report.passed_how = "passed against the target"
        return report
    if report.cores < min_cores and reference is not None:
        ref_times = [_time(reference, s)[0] for s in seeds[:repeats]]
        report.reference_s = statistics.median(ref_times)
        if report.speedup >= relative * (report.reference_speedup or 0.0):
            report.passed_how = ("passed relative to gpulab's reference "
                                 f"({judge.relative_bar_why(min_cores, relative, round(report.cores, 2))})")
            return report
    bar = f"at least {at_least:.2f}x" + (f" (or {relative:.2f} x the reference's {report.reference_speedup:.2f}x on "
                                         f"a machine short of cores)" if report.reference_s is not None else "")
    msg = f"{what}: needs {bar}; measured {report}"
    if hint:
        msg += f"\n  Hint: {hint}"
    raise GradingError(msg)
