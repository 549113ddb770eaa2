"""Late submissions in grades.csv: "late by N h, P points off" where a submission was late, nothing
where it was on time, and a student's extension (``make hub-extend``, nbgrader's own
``SubmittedAssignment.extension``) honoured by ``make grade`` (real nbgrader gradebooks)."""

from __future__ import annotations

import csv
import datetime as dt
import shutil
from pathlib import Path

import pytest
from conftest import lab_class
from nbgrader.api import Gradebook

from gpulab.autograde import gradebook
from gpulab.autograde.box import integrity
from gpulab.autograde.limits import Limits, SandboxResult
from gpulab.autograde.run import grade
from gpulab.confine import isolation
from gpulab.hub import extensions

LAB = "00_setup"
DUE = dt.datetime(2026, 10, 1, 17)


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Lab 00 released with a due date; kia and lev hand in the source notebook (every answer)."""
    course = lab_class(tmp_path_factory.mktemp("late") / "course", LAB, ("kia", "lev"), ())
    with Gradebook(gradebook.db_url(course), course_id="") as gb:
        gb.update_or_create_assignment(LAB, duedate=DUE)
    return course


def _copy(released: Path, tmp_path: Path) -> Path:
    shutil.copytree(released, tmp_path / "course", symlinks=True)
    return tmp_path / "course"


def test_the_late_note_says_hours_and_points() -> None:
    assert gradebook.late_note(2.5 * 3600, 8, 8) == "late by 2.5 h, 8 points off (8 before the penalty)"
    assert gradebook.late_note(1.26 * 3600, 1, 4) == "late by 1.3 h, 1 point off (4 before the penalty)"
    assert gradebook.late_note(3 * 3600, 0, 0) == "late by 3.0 h, 0 points off"  # late, nothing to take
    assert gradebook.late_note(90, 10, 10) == "late by under 0.1 h, 10 points off (10 before the penalty)"


def test_merge_notes_a_late_submission_and_nothing_on_an_on_time_or_extended_one(released, tmp_path) -> None:
    course = _copy(released, tmp_path)
    specs = integrity.lab_spec(gradebook.db_url(course), LAB)
    auto = {(name, c.name): c.points for name, spec in specs.items() for c in spec.cells
            if c.grade and c.cell_type == "code"}
    full = float(sum(auto.values()))
    extensions.extend(course, LAB, "kia", extensions.shown(DUE + dt.timedelta(hours=3)))
    work = tmp_path / "work"
    work.mkdir()
    for name in specs:
        shutil.copy(course / "source" / LAB / f"{name}.ipynb", work)
    late = {name: full for name in specs}  # what the course's "zero" penalty sets: every point
    cases = {  # student: (submitted at, nbgrader's penalty in the grading copy, score, notes)
        "lev": (DUE + dt.timedelta(hours=2, minutes=30), late, 0.0, [f"late by 2.5 h, {full:g} points off "
                                                                      f"({full:g} before the penalty)"]),
        "kia": (DUE + dt.timedelta(hours=2, minutes=30), dict.fromkeys(specs), full, []),  # before her 20:00
        "mo": (DUE - dt.timedelta(minutes=1), dict.fromkeys(specs), full, []),
    }
    for student, (when, penalties, score, notes) in cases.items():
        result = SandboxResult(student, LAB, grades=auto, autograded=work, timestamp=when,
                               late_penalties=penalties)
        assert gradebook.merge(course, result)[0] == score, (student, result.notes)
        assert [n for n in result.notes if "manual" not in n and "formgrader" not in n] == notes, student


@pytest.mark.timeout(900)
def test_make_grade_honours_an_extension_and_penalises_the_late_one(released, tmp_path) -> None:
    """Both hand in every answer two hours after the due date; kia has until three hours after."""
    course = _copy(released, tmp_path)
    for student in ("kia", "lev"):
        (course / "submitted" / student / LAB / "timestamp.txt").write_text("2026-10-01 19:00:00.000000 UTC")
    assert extensions.extend(course, LAB, "kia", "2026-10-01 20:00:00 UTC").startswith("kia may submit 00_setup")
    plan = isolation.detect()
    limits = Limits(wall_s=300, cell_timeout_s=60, memory_mb=1536, allow_weaker=bool(plan.off()))
    rows = {r.student: r for r in grade(course, LAB, jobs=2, limits=limits, progress=False, plan=plan)}
    with Gradebook(gradebook.db_url(course), course_id="") as gb:
        kia, lev = gb.find_submission(LAB, "kia"), gb.find_submission(LAB, "lev")
        earned = float(lev.score)
        assert earned > 0 and float(kia.score) == earned, "both answers earn the same points"
        assert kia.total_seconds_late == 0 and not kia.late_submission_penalty, "nbgrader honoured the extension"
        assert lev.total_seconds_late == 2 * 3600 and float(lev.late_submission_penalty) == earned
    assert rows["kia"].score == earned and "late by" not in rows["kia"].notes, rows["kia"]
    assert rows["lev"].score == 0, rows["lev"]
    assert f"late by 2.0 h, {earned:g} points off ({earned:g} before the penalty)" in rows["lev"].notes, rows["lev"]
    with (course / "grades.csv").open() as f:  # grades.csv's columns as they were; the note in notes
        written = {r["student"]: r for r in csv.DictReader(f)}
    assert list(written["lev"]) == ["student", "lab", "score", "max_score", "notes"]
    assert written["lev"]["notes"].count("late by 2.0 h") == 1 and "late by" not in written["kia"]["notes"]
