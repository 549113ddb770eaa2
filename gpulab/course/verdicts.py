"""The verdict of a test cell, from two streams of evidence, in the grader's process.

The reference kernel ran the lab's source notebook once for this grading run and sent, for each
check of each test cell, the check and the expected value (:mod:`gpulab.grading.evidence`); the
student's kernel sent only its values. :func:`judge_cell` pairs them in order: the n-th value of
a cell answers the n-th check. A value that is missing (the cell stopped), extra, of the wrong
kind or unreadable fails the cell; so does an error the kernel reported. Nothing the student's
kernel sent is ever run or trusted beyond being compared.

:class:`Expected` is that reference run, as the grader keeps it (``expected.json``, readable by
the grader only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulab.course.timing import Runs, speed_verdict
from gpulab.grading import judge

VERSION = 1


@dataclass
class CellResult:
    """The grader's verdict on one test cell."""

    passed: bool
    message: str = ""              # why it failed, for the student (the first failing check)
    figures: list[str] = field(default_factory=list)  # timed checks' measurements, shown either way
    note: str = ""                 # what the grader saw that a human should look at (grades.csv)


@dataclass
class Expected:
    """One lab's reference run: for each notebook and test cell, the entries its checks sent."""

    lab: str
    seed: int
    cpus: int
    cells: dict[str, dict[str, dict[str, Any]]]   # notebook -> grade_id -> {"entries": [...], "error": str}
    seconds: float = 0.0

    def cell(self, notebook: str, grade_id: str) -> dict[str, Any] | None:
        return self.cells.get(notebook, {}).get(grade_id)

    def save(self, path: Path) -> None:
        data = {"version": VERSION, "lab": self.lab, "seed": self.seed, "cpus": self.cpus, "seconds": self.seconds,
                "cells": self.cells}
        path.write_text(json.dumps(data))
        path.chmod(0o600)

    @classmethod
    def load(cls, path: Path) -> "Expected":
        data = json.loads(Path(path).read_text())
        if data.get("version") != VERSION:
            raise ValueError(f"{path} is not a reference run of this gpulab (version {data.get('version')})")
        return cls(data["lab"], int(data["seed"]), int(data["cpus"]), data["cells"], float(data.get("seconds", 0)))

    def problems(self) -> list[str]:
        """Where the reference run itself fails its checks: the source notebook has a bug, and no
        submission of this lab can be graded against it."""
        out = []
        for nb, cells in self.cells.items():
            for gid, cell in cells.items():
                if cell.get("error"):
                    out.append(f"{nb}/{gid}: the reference run raised {cell['error'][:300]}")
                    continue
                runs = {n: Runs.from_json(e["runs"]) for n, e in enumerate(cell["entries"]) if _is_entry(e, "timed")}
                result = judge_cell(cell, cell["entries"], runs, "")
                if not result.passed:
                    out.append(f"{nb}/{gid}: {result.message[:300]}")
        return out


def _is_entry(record: Any, kind: str) -> bool:
    return isinstance(record, dict) and record.get("kind") == kind


def judge_cell(reference: dict[str, Any], records: list[Any], runs: dict[int, Runs], kernel_error: str) -> CellResult:
    """Judge one test cell.

    Args:
        reference: the reference run's cell: ``{"entries": [...]}``, each a check (``spec``,
            ``expected``) or a timed check (``spec``, ``runs``).
        records: what the student's kernel sent in the cell, in order (raw JSON, untrusted).
        runs: for the n-th record that announced a timed check, what the grader measured.
        kernel_error: the error the kernel reported for the cell ('' if none).
    """
    result = _judge(reference["entries"], records, runs, kernel_error)
    if "MaskedReference" in kernel_error:
        result.note = "called gpulab's reference, which is masked while grading (" + kernel_error[:200] + ")"
    return result


def _judge(entries: list[dict[str, Any]], records: list[Any], runs: dict[int, Runs], kernel_error: str) -> CellResult:
    figures: list[str] = []
    capped = ""
    if len(records) > len(entries):  # a value for every check and no more: forged or doubled evidence fails first
        why = (f"the cell sent {len(records) - len(entries)} more value(s) than its checks make "
               "(a check called from your own code, or evidence sent by hand)")
        return CellResult(False, why, figures, note=why)
    for n, entry in enumerate(entries):
        spec = entry.get("spec", {})
        what = spec.get("what") or f"check {n + 1}"
        if n >= len(records):
            stop = f": {kernel_error}" if kernel_error else ""
            return CellResult(False, f"the test stopped before checking {what}{stop}", figures)
        got = records[n]
        if _is_entry(entry, "timed"):
            if not _is_entry(got, "timed") or n not in runs:
                why = f"{what}: the cell did not hand its timed work to the grader"
                return CellResult(False, why, figures, note=why)
            mine = runs[n]
            why, shown = speed_verdict(spec, mine, Runs.from_json(entry["runs"]))
            if shown:
                figures.append(shown)
            if "counted as" in (why or "") + shown:
                capped = f"{what}: the baseline ran slower than the reference run's, and was capped"
            if why:
                odd = "less than" in why or "malformed" in mine.error or "results instead of one" in mine.error
                return CellResult(False, why, figures, note=why.splitlines()[0] if odd else capped)
            continue
        if not _is_entry(got, "check") or "value" not in got:
            why = f"{what}: the cell sent something other than this check's value"
            return CellResult(False, why, figures, note=why)
        try:
            why = judge.verdict(spec, judge.decode(got["value"]), judge.decode(entry.get("expected")))
        except (judge.EvidenceError, RecursionError) as err:
            why = f"{what}: the value sent could not be read ({err or 'nested too deeply'})"
            return CellResult(False, why, figures, note=why)
        if why:
            return CellResult(False, why, figures)
    if kernel_error:
        return CellResult(False, f"every check passed, but the cell then raised {kernel_error}", figures, note=capped)
    return CellResult(True, "", figures, note=capped)
