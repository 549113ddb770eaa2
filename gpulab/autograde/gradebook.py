"""The real gradebook: snapshot it for the sandboxes, and merge each sandbox's result into it.

Only the grading process writes ``gradebook.db``, one submission at a time, through nbgrader's own
:class:`nbgrader.api.Gradebook`, so parallel grading never meets "database is locked" and the
formgrader and ``nbgrader export`` read what nbgrader's autograde would have written: each cell's
auto score and comment, the late penalty and timestamp, ``needs_manual_grade`` as nbgrader sets
it, the autograded notebooks (swapped in by one rename); or, for a submission that could not be
graded, zero for every cell and no autograded copy. Each merge is one transaction, and
:func:`backup` keeps the gradebook from before each run.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
import warnings
from pathlib import Path

from sqlalchemy.exc import SAWarning

from gpulab.accounts import students
from gpulab.autograde.box import links
from gpulab.autograde.limits import SandboxResult

BACKUPS_KEPT = 5


def db_url(course: Path) -> str:
    return f"sqlite:///{Path(course) / 'gradebook.db'}"


def snapshot(course: Path, dst: Path) -> Path:
    """A consistent copy of the course gradebook (sqlite's online backup, safe while formgrader reads it)."""
    src = sqlite3.connect(f"file:{Path(course) / 'gradebook.db'}?mode=ro", uri=True)
    out = sqlite3.connect(dst)
    try:
        src.backup(out)
    finally:
        out.close()
        src.close()
    return dst


def backup(course: Path) -> Path:
    """Copy the gradebook to ``gradebook_backups/gradebook-<time>.db``, keeping the newest :data:`BACKUPS_KEPT`."""
    folder = Path(course) / "gradebook_backups"
    folder.mkdir(exist_ok=True)
    dst = folder / time.strftime("gradebook-%Y%m%d-%H%M%S.db")
    n = 1
    while dst.exists():
        dst, n = folder / time.strftime(f"gradebook-%Y%m%d-%H%M%S-{n}.db"), n + 1
    snapshot(course, dst)
    for old in sorted(folder.glob("gradebook-*.db"))[:-BACKUPS_KEPT]:
        old.unlink()
    return dst


def _replace_autograded(course: Path, result: SandboxResult, max_bytes: int) -> list[str]:
    """Swap in the new autograded copy (regular notebooks only) in one rename; return what was skipped."""
    dest = Path(course) / "autograded" / students.alias(result.student) / result.lab
    dest.parent.mkdir(parents=True, exist_ok=True)
    new, old = dest.with_name(f".{dest.name}.new"), dest.with_name(f".{dest.name}.old")
    for stale in (new, old):
        if stale.exists():
            shutil.rmtree(stale)
    skipped = links.copy_notebooks(result.autograded, new, max_bytes)
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return skipped


def merge(course: Path, result: SandboxResult, max_bytes: int = 100 * 2**20) -> tuple[float, float]:
    """Record ``result`` in the course gradebook in one transaction (``max_bytes``: the largest
    autograded notebook copied back); return (score, max_score) as nbgrader now computes them."""
    from nbgrader.api import Gradebook

    graded = result.status == "graded" and result.autograded is not None
    student = students.alias(result.student)  # nbgrader's tools (export, feedback, formgrader) need a plain name
    if student != result.student:
        result.notes.append(f"its id is not a plain name: in nbgrader's gradebook, autograded/ and feedback/ it is "
                            f"{student}")
    with Gradebook(db_url(course), course_id="") as gb, warnings.catch_warnings():
        # nbgrader's add_submission builds rows through relationships; SQLAlchemy warns about its
        # autoflush order on every new submission (nbgrader's own autograde does the same).
        warnings.simplefilter("ignore", category=SAWarning)
        try:
            gb.update_or_create_student(student)
            kwargs = {"timestamp": result.timestamp} if result.timestamp is not None else {}
            sub = gb.update_or_create_submission(result.lab, student, **kwargs)
            for nb in sub.notebooks:
                if graded:
                    nb.late_submission_penalty = result.late_penalties.get(nb.name)
                for grade in nb.grades:
                    grade.auto_score = result.grades.get((nb.name, grade.name)) if graded else 0.0
                    grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
                for comment in nb.comments:
                    comment.auto_comment = result.comments.get((nb.name, comment.name)) if graded else None
            gb.db.flush()
            if graded:
                skipped = _replace_autograded(course, result, max_bytes)
                if skipped:
                    result.notes.append(f"autograded files not copied back: {', '.join(skipped)}")
            else:  # as `nbgrader autograde --force` does; a stale copy would contradict the gradebook
                shutil.rmtree(Path(course) / "autograded" / student / result.lab, ignore_errors=True)
            gb.db.commit()
        except BaseException:
            gb.db.rollback()
            raise
        sub = gb.find_submission(result.lab, student)
        score, max_score = float(sub.score), float(sub.max_score)
        penalty = float(sub.late_submission_penalty or 0)
        late_s = float(sub.total_seconds_late)  # past the student's own deadline (an extension included)
        if late_s > 0 or penalty:
            result.notes.append(late_note(late_s, penalty, score))
        if penalty:  # nbgrader keeps the penalty beside the score; grades.csv shows what counts
            score = max(0.0, score - penalty)
        if graded:
            written, other = _waiting(sub)
            if written:
                result.notes.append(f"{written:g} point(s) of written answers wait for manual grading in the formgrader")
            if other:
                result.notes.append(f"{other:g} point(s) of manually graded cells wait for the formgrader")
    return score, max_score


def late_note(seconds: float, penalty: float, before: float) -> str:
    """grades.csv's note on a late submission: "late by 2.5 h, 8 points off (8 before the penalty)"."""
    hours = seconds / 3600
    late = f"{hours:.1f} h" if hours >= 0.05 else "under 0.1 h"
    points = f"{penalty:g} point{'' if penalty == 1 else 's'} off"
    return f"late by {late}, {points}" + (f" ({before:g} before the penalty)" if penalty else "")


def _waiting(sub: object) -> tuple[float, float]:
    """Points no autograder gives and nobody gave yet: (written answers, other manually graded cells)."""
    written = other = 0.0
    for nb in sub.notebooks:  # type: ignore[attr-defined]
        for grade in nb.grades:
            if grade.auto_score is None and grade.manual_score is None:
                if grade.cell.cell_type == "markdown":
                    written += float(grade.max_score)
                else:
                    other += float(grade.max_score)
    return written, other


def manual_points(course: Path, lab: str, student: str) -> float:
    """:func:`_waiting`'s points of one submission, together (full auto marks are max_score less these)."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url(course), course_id="") as gb:
        return float(sum(_waiting(gb.find_submission(lab, students.alias(student)))))


def scores(course: Path, lab: str, student: str) -> tuple[float, float]:
    """(score, max_score) of one submission in the course gradebook (``student``: the id in submitted/)."""
    from nbgrader.api import Gradebook

    student = students.alias(student)

    with Gradebook(db_url(course), course_id="") as gb:
        sub = gb.find_submission(lab, student)
        return float(sub.score), float(sub.max_score)


def max_score(course: Path, lab: str) -> float:
    """The lab's maximum score, 0.0 when the gradebook does not know the lab yet."""
    from nbgrader.api import Gradebook, MissingEntry

    if not (Path(course) / "gradebook.db").exists():
        return 0.0
    with Gradebook(db_url(course), course_id="") as gb:
        try:
            return float(gb.find_assignment(lab).max_score)
        except MissingEntry:
            return 0.0
