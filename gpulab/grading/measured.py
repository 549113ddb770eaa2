"""A graded measurement of the student's work, taken by whoever can be trusted to take it.

``check_measured(work, rule=..., ...)`` names one piece of work, ``work(seed) -> result``, and a
rule of :mod:`gpulab.verdict` that judges what running it costs. The lessons that need it are the
ones whose point is elapsed time or consumption (the device kept busy, loading overlapped with
compute, reads that fit the chunks), and the work is built so that what it costs does not move
with the machine's load: modelled device time (the simulated accelerator's clock, stalling reads)
that a busy CPU does not stretch, or counts that only grow (bytes read, read calls, CPU seconds).

- **Interactively** (Run All, Validate) the work runs here, ``repeats`` times, measured by this
  process, and the rule decides (with no reference run: ``ref=None``).
- **Under the grader** nothing is measured in the student's kernel. The cell only registers the
  work; after the cell, the grader asks the kernel to run it, ``repeats`` times, each on a seed it
  reveals only in that request, and measures each run from outside: its own clock, the kernel's
  cgroup and ``/proc`` counters (:mod:`gpulab.confine.meter`). Each run's result must equal the
  reference run's for the same seed (work skipped or faked fails), and the rule judges the
  measurements, with the reference run's beside them. Concurrent grading jobs take their measured
  runs one at a time, each on cores of its own.

    grading.check_measured(lambda seed: loop_without_sync(seed), rule="lab01.overlapped",
                           what="loop C without the per-step sync", steps=STEPS, device_s=0.020)
"""

from __future__ import annotations

import os
import random
import resource
import time
from typing import Any, Callable

from gpulab.evidence import wire
from gpulab.evidence.codec import encode
from gpulab.evidence.records import Measured, Result
from gpulab.grading import inputs
from gpulab.grading.checks import GradingError
from gpulab.i18n import messages
from gpulab.verdict import check as judge
from gpulab.verdict import rules
from gpulab.verdict.rules import Measurement

__all__ = ["check_measured", "MeasuredByGrader", "register_measured", "run_measured"]

Work = Callable[[int], Any]


class MeasuredByGrader:
    """What a graded kernel gets back: the measuring happens after the cell, from the grader's side."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"{self.what}: measured by the grader after this cell"


def _io() -> dict[str, int]:
    out = {}
    try:
        for line in open(f"/proc/{os.getpid()}/io"):
            key, _, value = line.partition(":")
            out[key.strip()] = int(value)
    except OSError:
        pass
    return out


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure_here(work: Work, seed: int) -> tuple[Measurement, Any]:
    """Run ``work(seed)`` in this process and measure it as the grader would (this process and the
    children it reaped): ``(Measurement, result)``."""
    from gpulab.devices.physical import synchronize_all

    synchronize_all()
    io0, c0, t0 = _io(), _cpu(), time.perf_counter()
    result = work(seed)
    synchronize_all()  # queued GPU work counts
    wall, cpu, io1 = time.perf_counter() - t0, _cpu() - c0, _io()

    def delta(key: str) -> int | None:
        return io1[key] - io0[key] if key in io0 and key in io1 else None

    return Measurement(wall, cpu, delta("rchar"), delta("syscr"), delta("read_bytes"), delta("wchar")), result


def check_measured(work: Work, *, what: str, rule: str, hint: str = "", repeats: int = 2, warmup: int = 1,
                   rtol: float | None = 1e-4, atol: float | None = 1e-5, **params: Any) -> Any:
    """``work``'s measurements keep ``rule`` (see the module doc).

    Args:
        work: one unit of work, ``fn(seed) -> result``; the result (a loss, a few numbers, a small
            tensor) is what the grader compares with the reference run's, within ``rtol``/``atol``.
        what, hint: for the message.
        rule: a rule of :mod:`gpulab.verdict` (``"lab01.overlapped"``), called with the list of
            :class:`~gpulab.verdict.rules.Measurement` of the student's runs, the reference run's
            (None interactively) and ``params``.
        repeats: measured runs, after ``warmup`` unmeasured ones.

    Returns:
        Interactively, the measurements; under the grader, a placeholder.

    Raises:
        GradingError: interactively, when the rule fails.
        ValueError: for ``repeats < 1`` or ``warmup < 0``.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    m = wire.mode()
    if m != wire.INTERACTIVE:
        spec = {"kind": "measured", "what": what, "hint": hint, "rule": rule, "params": encode(params),
                "repeats": repeats, "warmup": warmup, "rtol": rtol, "atol": atol}
        wire.emit(Measured(register_measured(work), spec if m == wire.REFERENCE else None))
        return MeasuredByGrader(what)
    seeds = random.Random(f"{inputs.seed()}:measured:{what}").sample(range(2**30), warmup + repeats)
    for s in seeds[:warmup]:
        work(s)
    runs = [measure_here(work, s)[0] for s in seeds[warmup:]]
    spec = messages.localize({"kind": "measured", "what": what, "hint": hint}, messages.student_lang())
    why = rules.judge(rule, runs, None, **params)
    if why:
        raise GradingError(judge.fail(spec, why))
    return runs


# ---- the grader's measured requests ----------------------------------------------------------

_MEASURED: dict[int, Work] = {}


def register_measured(work: Work) -> int:
    """Keep ``work`` (``fn(seed)``) for the grader's measured requests; returns its id."""
    ident = len(_MEASURED)
    _MEASURED[ident] = work
    return ident


def run_measured(ident: int, seed_: int) -> None:
    """What the grader's measured request runs: the one piece of work ``ident`` names, on a seed it
    reveals only now; the result goes back as evidence, to be compared with the reference run's."""
    result = _MEASURED[ident](seed_)
    from gpulab.devices.physical import synchronize_all

    synchronize_all()  # the grader's clock stops at the reply: queued GPU work must be done by then
    wire.emit(Result(encode(result)))
