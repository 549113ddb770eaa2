"""The last stage: each result merged into the course's gradebook, the copying notes, and
``grades.csv`` with the table ``make grade`` prints."""

from __future__ import annotations

import csv
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpulab.accounts import students
from gpulab.autograde import gradebook
from gpulab.autograde.limits import SandboxResult

NOT_YET = "not graded: the grading run stopped before this submission; run make grade again"


@dataclass
class GradeRow:
    """One line of ``grades.csv``."""

    student: str
    lab: str
    score: float = 0.0
    max_score: float = 0.0
    notes: str = ""


def write_csv(rows: list[GradeRow], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["student", "lab", "score", "max_score", "notes"])
        for r in rows:  # ids and notes are the students' words: a spreadsheet must show them, not run them
            w.writerow([students.csv_cell(r.student), r.lab, f"{r.score:g}", f"{r.max_score:g}", students.csv_cell(r.notes)])


def write_progress(rows: list[GradeRow], pending: dict[tuple[str, str], None], path: Path) -> None:
    """grades.csv as it stands, with a row for each submission still waiting (a run may be killed)."""
    waiting = [GradeRow(s, lab_, notes=NOT_YET) for s, lab_ in pending]
    write_csv(sorted(rows + waiting, key=lambda r: (r.lab, r.student)), path)


def _keep_log(course: Path, result: SandboxResult) -> None:
    """Keep nbgrader's output of each submission in ``<course>/grading_logs/<lab>/<student>.log``."""
    if result.log is not None and result.log.exists():
        dest = course / "grading_logs" / result.lab / f"{result.student}.log"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(result.log, dest)


def record(course: Path, result: SandboxResult, max_bytes: int) -> GradeRow:
    """Merge one result into the course's gradebook; its row of grades.csv."""
    row = GradeRow(result.student, result.lab)
    try:
        row.score, row.max_score = gradebook.merge(course, result, max_bytes)
    except Exception as err:  # one bad merge must not stop the class
        row.max_score = gradebook.max_score(course, result.lab)
        result.notes.append(f"could not record in the gradebook: {err}")
    row.notes = "; ".join(result.notes)
    try:
        _keep_log(course, result)
    except OSError as err:
        row.notes = "; ".join(filter(None, [row.notes, f"no grading log: {err}"]))
    return row


def note_copies(course: Path, rows: list[GradeRow]) -> None:
    """Note the answer cells found in a reference, the solution or a classmate's
    (:mod:`gpulab.autograde.similarity`); a failure here costs the notes, never the grades."""
    from gpulab.autograde import similarity
    from gpulab.autograde.box.mask import lab_references

    by_lab: dict[str, list[GradeRow]] = {}
    for row in rows:
        by_lab.setdefault(row.lab, []).append(row)
    for lab_, lab_rows in by_lab.items():
        try:
            copies = similarity.lab_copies(course, lab_, [r.student for r in lab_rows], lab_references(lab_))
        except Exception as err:  # a missing or broken copydetect must not stop the class
            print(f"similarity check of {lab_} skipped: {type(err).__name__}: {err}", flush=True)
            continue
        for row in lab_rows:
            found = [n for n in similarity.notes(copies.get(row.student, [])) if n not in row.notes]
            if found:
                row.notes = "; ".join(filter(None, [row.notes, *found]))


def print_table(rows: list[GradeRow], seconds: float | None = None) -> None:
    """The summary table: student, lab, score, notes."""
    if not rows:
        print("no submissions found under notebooks/submitted/<student>/<lab>/")
        return
    w = max(len("student"), *(len(students.shown(r.student)) for r in rows))
    print(f"{'student':<{w}}  {'lab':<18} {'score':>11}  notes")
    for r in rows:
        print(f"{students.shown(r.student):<{w}}  {r.lab:<18} {r.score:>5g}/{r.max_score:<5g}  {r.notes}")
    full = sum(r.max_score > 0 and r.score == r.max_score for r in rows)
    noted = sum(bool(r.notes) for r in rows)
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    print(f"{len(rows)} submission(s) graded{took}: {full} full marks, {noted} with notes")
