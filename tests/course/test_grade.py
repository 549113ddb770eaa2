"""gpulab.course.grade: grading survives a corrupt submission and still grades the others; bad arguments
are refused with the fix."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from conftest import COURSE

from gpulab.course import grade as grading_run
from gpulab.course.__main__ import main as course_main
from gpulab.course.release import release


@pytest.mark.notebook
@pytest.mark.timeout(900)
def test_grade_reports_a_corrupt_submission_and_grades_the_rest(tmp_path: Path) -> None:
    course = tmp_path
    shutil.copytree(COURSE / "source", course / "source")
    shutil.copy(COURSE / "nbgrader_config.py", course)
    release(course, "00_setup")
    good = course / "submitted" / "alice" / "00_setup"
    shutil.copytree(course / "source" / "00_setup", good)
    bad = course / "submitted" / "bob" / "00_setup"
    bad.mkdir(parents=True)
    (bad / "00_setup.ipynb").write_text('{"cells": [ this is not json')
    rows = grading_run.grade(course, "00_setup")
    by_student = {r.student: r for r in rows}
    assert by_student["alice"].score == by_student["alice"].max_score > 0
    assert by_student["bob"].score == 0 and "not valid JSON" in by_student["bob"].notes
    with open(course / "grades.csv") as fh:
        table = {r["student"]: r for r in csv.DictReader(fh)}
    assert set(table) == {"alice", "bob"} and "resubmit" in table["bob"]["notes"]


def test_grade_rejects_bad_jobs_and_unknown_labs(tmp_path: Path) -> None:
    shutil.copytree(COURSE / "source", tmp_path / "source")
    with pytest.raises(ValueError, match="at least 1"):
        grading_run.grade(tmp_path, jobs=0)
    with pytest.raises(ValueError, match="00_setup"):
        grading_run.grade(tmp_path, "99_nope")
    assert course_main(["grade", "--course", str(tmp_path), "--jobs", "1", "--memory-mb", "10"]) == 2
    assert course_main(["collect", "--course", str(tmp_path), "--archive", "x.zip"]) == 2
