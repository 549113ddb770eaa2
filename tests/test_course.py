"""The course tools: copy-work never overwrites a student's edits; grading survives a corrupt
submission and still grades the others."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from conftest import COURSE
from gpulab.course import grade as grading_run
from gpulab.course.release import copy_work, release


def test_copy_work_keeps_existing_files(tmp_path: Path) -> None:
    course = tmp_path / "course"
    (course / "release" / "00_setup").mkdir(parents=True)
    (course / "release" / "00_setup" / "00_setup.ipynb").write_text("release v1")
    work = tmp_path / "work"
    copied, kept = copy_work(course, work)
    assert [p.name for p in copied] == ["00_setup.ipynb"] and kept == []
    (work / "00_setup" / "00_setup.ipynb").write_text("my edits")
    (course / "release" / "00_setup" / "00_setup.ipynb").write_text("release v2")
    (course / "release" / "00_setup" / "extra.py").write_text("new file")
    copied, kept = copy_work(course, work)
    assert (work / "00_setup" / "00_setup.ipynb").read_text() == "my edits"
    assert (work / "00_setup" / "extra.py").read_text() == "new file"
    assert [p.name for p in copied] == ["extra.py"] and [p.name for p in kept] == ["00_setup.ipynb"]


def test_copy_work_without_release_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="make release"):
        copy_work(tmp_path, tmp_path / "work")


def test_release_unknown_lab_lists_the_labs(tmp_path: Path) -> None:
    shutil.copytree(COURSE / "source", tmp_path / "source")
    with pytest.raises(SystemExit, match="00_setup"):
        release(tmp_path, "99_nope")


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
