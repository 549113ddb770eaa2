"""The verdict of a test cell, from two streams of evidence: pure, no I/O.

The reference kernel ran the lab's source notebook once for this grading run and sent, for each
check of each test cell, the check and the solution's value (and a visible test's literal); the
student's kernel sent only its values. :func:`judge_cell` pairs them in order: the n-th value of a
cell answers the n-th check. A value that is missing, extra, of the wrong kind or unreadable fails
the cell, and so does an error the kernel reported. What the student's kernel sent is only ever
decoded and compared, never run.

A measured check (``grading.check_measured``) is measured by the grader, from outside the kernel,
once per seed it reveals in that request (:class:`MeasuredRuns`); :func:`measured_verdict`
compares each run's result with the reference run's and applies the check's rule to the
measurements.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from gpulab.evidence.codec import EvidenceError, decode
from gpulab.evidence.records import ABSENT, Check, Measured, MeasuredEntry, parse, parse_entry
from gpulab.i18n import messages
from gpulab.verdict import check as judge
from gpulab.verdict import rules
from gpulab.verdict.rules import Measurement


def measured_seeds(secret: str, notebook: str, grade_id: str, index: int, count: int) -> list[int]:
    """The seeds of one measured check's runs, derived from the grading run's ``secret``: the same for
    the reference kernel and every student, and never given to a kernel before its request."""
    def draw(i: int) -> int:
        digest = hashlib.sha256(f"{secret}:{notebook}:{grade_id}:{index}:measured:{i}".encode()).digest()
        return int.from_bytes(digest[:4], "little") % 2**30

    return [draw(i) for i in range(count)]


@dataclass
class MeasuredRuns:
    """What the grader measured of one measured check in one kernel: per measured seed, the run's
    :class:`Measurement` and its result (encoded, as the kernel sent it)."""

    measurements: list[Measurement] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    error: str = ""      # why the runs stopped (a failed request, a missing result)

    def to_json(self) -> dict[str, Any]:
        return {"measurements": [m.to_json() for m in self.measurements], "results": self.results, "error": self.error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MeasuredRuns":
        return cls([Measurement.from_json(m) for m in data.get("measurements", [])], list(data.get("results", [])),
                   str(data.get("error", "")))


def describe(runs: list[Measurement]) -> str:
    """The measurements, as the feedback shows them."""
    def one(m: Measurement) -> str:
        parts = [f"{m.wall_s * 1e3:.1f} ms"]
        if m.cpu_s is not None:
            parts.append(f"CPU {m.cpu_s * 1e3:.1f} ms")
        if m.read_chars is not None:
            parts.append(f"read {m.read_chars / 2**20:.2f} MiB in {m.read_calls} calls")
        return ", ".join(parts)

    return "; ".join(one(m) for m in runs)


def measured_verdict(spec: dict[str, Any], mine: MeasuredRuns, ref: MeasuredRuns | None) -> tuple[str | None, str]:
    """(why the measured check fails or None, the figures measured, for the feedback)."""
    what = spec.get("what") or "measurement"
    if mine.error:
        return judge.fail(spec, mine.error), ""
    repeats = int(spec.get("repeats", 1))
    if len(mine.measurements) != repeats or len(mine.results) != repeats:
        return judge.fail(spec, "the measured runs did not all complete"), ""
    if ref is not None:
        for i, (got, want) in enumerate(zip(mine.results, ref.results)):
            try:
                why = judge.verdict({"kind": "close", "what": f"the result of run {i + 1}", "rtol": spec.get("rtol"),
                                     "atol": spec.get("atol")}, decode(got), decode(want))
            except EvidenceError as err:
                why = f"the result of run {i + 1} could not be read: {err}"
            if why:
                return judge.fail(spec, f"the measured work did not give the reference's result ({why})"), ""
    figures = f"{what}: {describe(mine.measurements)} (measured by the grader)"
    params = decode(spec.get("params") if spec.get("params") is not None else {"$dict": []})
    if not isinstance(params, dict) or not all(isinstance(k, str) and k.isidentifier() for k in params):
        return judge.fail(spec, "the check's parameters could not be read"), figures
    why = rules.judge(str(spec.get("rule")), mine.measurements, ref.measurements if ref else None, **params)
    return (None if why is None else judge.fail(spec, why)), figures


@dataclass
class CellResult:
    """The grader's verdict on one test cell."""

    passed: bool
    message: str = ""              # why it failed, for the student (the first failing check)
    figures: list[str] = field(default_factory=list)  # measured checks' figures, shown either way
    note: str = ""                 # what a human should look at (grades.csv)


def expected_of(entry: Check) -> Any:
    """A reference check's expected side: the visible test's literal if it gave one, else the
    solution's own value of the same check."""
    return entry.value if entry.expected is ABSENT else entry.expected


def judge_cell(reference: dict[str, Any], records: list[Any], runs: dict[int, MeasuredRuns], kernel_error: str,
               lang: str | None = None, ref_runs: dict[int, MeasuredRuns] | None = None) -> CellResult:
    """Judge one test cell.

    Args:
        reference: the reference run's cell: ``{"entries": [...]}``, each a check (``spec``,
            ``value``, maybe ``expected``) or a measured check (``spec``, ``runs``).
        records: what the student's kernel sent in the cell, in order (raw JSON, untrusted).
        runs: for the n-th record that announced a measured check, what the grader measured.
        kernel_error: the error the kernel reported for the cell ('' if none).
        ref_runs: the reference run's measurements (default: read from ``reference``).
    """
    result = _judge(reference["entries"], records, runs, kernel_error, lang, ref_runs)
    if "MaskedReference" in kernel_error:
        result.note = "called gpulab's reference, which is masked while grading (" + kernel_error[:200] + ")"
    return result


def _judge(raw_entries: list[Any], raw_records: list[Any], runs: dict[int, MeasuredRuns], kernel_error: str,
           lang: str | None, ref_runs: dict[int, MeasuredRuns] | None) -> CellResult:
    figures: list[str] = []
    if len(raw_records) > len(raw_entries):  # a value for every check and no more: forged or doubled evidence fails first
        why = (f"the cell sent {len(raw_records) - len(raw_entries)} more value(s) than its checks make "
               "(a check called from your own code, or evidence sent by hand)")
        return CellResult(False, why, figures, note=why)
    for n, raw in enumerate(raw_entries):
        entry = parse_entry(raw)
        if entry is None:
            return CellResult(False, f"the grader's reference for check {n + 1} is unreadable", figures)
        spec = messages.localize(entry.spec, lang)  # the student's language, if translated
        what = spec.get("what") or f"check {n + 1}"
        if n >= len(raw_records):
            stop = f": {kernel_error}" if kernel_error else ""
            return CellResult(False, f"the test stopped before checking {what}{stop}", figures)
        got = parse(raw_records[n])
        if isinstance(entry, MeasuredEntry):
            if not isinstance(got, Measured) or n not in runs:
                why = f"{what}: the cell did not hand its measured work to the grader"
                return CellResult(False, why, figures, note=why)
            ref = (ref_runs or {}).get(n) or MeasuredRuns.from_json(entry.runs)
            why, shown = measured_verdict(spec, runs[n], ref)
            if shown:
                figures.append(shown)
            if why:
                return CellResult(False, why, figures)
            continue
        if not isinstance(got, Check):
            why = f"{what}: the cell sent something other than this check's value"
            return CellResult(False, why, figures, note=why)
        try:
            why = judge.verdict(spec, decode(got.value), decode(expected_of(entry)))
        except (EvidenceError, RecursionError) as err:
            why = f"{what}: the value sent could not be read ({err or 'nested too deeply'})"
            return CellResult(False, why, figures, note=why)
        if why:
            return CellResult(False, why, figures)
    if kernel_error:
        return CellResult(False, f"every check passed, but the cell then raised {kernel_error}", figures)
    return CellResult(True, "", figures)


def self_check(cell: dict[str, Any]) -> str | None:
    """Why the reference run fails its own checks in this cell (a bug in the source notebook), or None:
    the solution against the visible tests' literals and its own rules."""
    if cell.get("error"):
        return f"the reference run raised {cell['error'][:300]}"
    entries = cell["entries"]
    records = [{"kind": "measured", "id": 0} if e.get("kind") == "measured" else
               {"kind": "check", "value": e.get("value")} for e in entries]
    runs = {n: MeasuredRuns.from_json(e["runs"]) for n, e in enumerate(entries) if e.get("kind") == "measured"}
    result = judge_cell(cell, records, runs, "")
    return None if result.passed else result.message[:300]
