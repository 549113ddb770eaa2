"""Autograde a class with nbgrader and write ``grades.csv``; one bad submission never stops the rest.

    python -m gpulab.course grade --course notebooks [--lab 00_setup]

Submissions live in ``<course>/submitted/<student>/<lab>/``. Each one is checked before nbgrader
sees it (a notebook that is not valid JSON gets a note and a zero), then autograded in its own
``nbgrader autograde`` process.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import nbformat

from gpulab.course.nbgrader_cli import find_labs, nbgrader


@dataclass
class GradeRow:
    student: str
    lab: str
    score: float = 0.0
    max_score: float = 0.0
    notes: str = ""


def submissions(course: Path, lab: str | None = None) -> list[tuple[str, str]]:
    """(student, lab) pairs found under ``submitted/``, sorted."""
    root = course / "submitted"
    if not root.is_dir():
        return []
    pairs = []
    for student in sorted(p for p in root.iterdir() if p.is_dir()):
        for lab_dir in sorted(p for p in student.iterdir() if p.is_dir()):
            if lab is None or lab_dir.name == lab:
                pairs.append((student.name, lab_dir.name))
    return pairs


def unreadable_notebooks(folder: Path) -> list[str]:
    """Notes for notebooks in ``folder`` that nbgrader could not even open."""
    notes = []
    for nb in sorted(folder.glob("*.ipynb")):
        try:
            nbformat.read(str(nb), as_version=4)
        except Exception as err:  # noqa: BLE001 - any failure to parse is the same for the student
            kind = "not valid JSON" if isinstance(err, (json.JSONDecodeError, ValueError)) else type(err).__name__
            notes.append(f"{nb.name} is {kind} ({str(err).splitlines()[0][:80]}); scored 0, resubmit a notebook saved by Jupyter")
    return notes


def scores_from_gradebook(course: Path, lab: str, student: str) -> tuple[float, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        sub = gb.find_submission(lab, student)
        return float(sub.score), float(sub.max_score)


def max_score(course: Path, lab: str) -> float:
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        try:
            return float(gb.find_assignment(lab).max_score)
        except MissingEntry:
            return 0.0


def ensure_released(course: Path, labs: set[str]) -> None:
    """The gradebook must know a lab's test cells before it can grade it."""
    for lab in sorted(labs):
        if max_score(course, lab) == 0.0:
            proc = nbgrader(course, "generate_assignment", lab, "--force")
            if proc.returncode != 0:
                raise RuntimeError(f"cannot register {lab} in the gradebook:\n{proc.stderr[-2000:]}")


def grade_one(course: Path, student: str, lab: str, timeout: float) -> GradeRow:
    row = GradeRow(student, lab, max_score=max_score(course, lab))
    bad = unreadable_notebooks(course / "submitted" / student / lab)
    if bad:
        row.notes = "; ".join(bad)
        return row
    proc = nbgrader(course, "autograde", lab, "--student", student, "--force", timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        row.notes = f"autograde failed: {tail[0][:200]}"
        return row
    row.score, row.max_score = scores_from_gradebook(course, lab, student)
    return row


def write_csv(rows: list[GradeRow], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["student", "lab", "score", "max_score", "notes"])
        for r in rows:
            w.writerow([r.student, r.lab, f"{r.score:g}", f"{r.max_score:g}", r.notes])


def grade(course: str | Path, lab: str | None = None, timeout: float = 1800) -> list[GradeRow]:
    """Autograde every submission (or one lab's) and write ``<course>/grades.csv``."""
    course = Path(course).resolve()
    known = set(find_labs(course))
    pairs = submissions(course, lab)
    rows: list[GradeRow] = []
    unknown = [(s, lab_) for s, lab_ in pairs if lab_ not in known]
    for s, lab_ in unknown:
        rows.append(GradeRow(s, lab_, notes=f"no lab called {lab_!r}; the labs are {', '.join(sorted(known))}"))
    pairs = [p for p in pairs if p[0:2] not in unknown]
    ensure_released(course, {lab_ for _, lab_ in pairs})
    for student, lab_ in pairs:
        rows.append(grade_one(course, student, lab_, timeout))
    rows.sort(key=lambda r: (r.lab, r.student))
    write_csv(rows, course / "grades.csv")
    return rows


def print_table(rows: list[GradeRow]) -> None:
    if not rows:
        print("no submissions found under notebooks/submitted/<student>/<lab>/")
        return
    w = max(len(r.student) for r in rows)
    for r in rows:
        print(f"{r.student:<{w}}  {r.lab:<18} {r.score:>5g}/{r.max_score:<5g} {r.notes}")
