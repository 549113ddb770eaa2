"""gpulab.autograde.run: grading survives a corrupt submission and still grades the others; bad arguments
are refused with the fix."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from conftest import COURSE

from gpulab.autograde import plan as planning
from gpulab.autograde import run as grading_run
from gpulab.autograde.__main__ import main as grade_main
from gpulab.confine import isolation
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
    weaker = bool(isolation.detect().off())  # a machine without namespaces grades too, noting it
    rows = grading_run.grade(course, "00_setup", limits=grading_run.Limits(
        memory_mb=planning.default_memory_mb(planning.default_jobs()), allow_weaker=weaker))
    by_student = {r.student: r for r in rows}
    from gpulab.autograde.gradebook import manual_points

    written = manual_points(course, "00_setup", "alice")  # the written answer waits for the instructor
    assert written == 2 and by_student["alice"].score == by_student["alice"].max_score - written > 0
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
    assert grade_main(["--course", str(tmp_path), "--jobs", "1", "--memory-mb", "10"]) == 2
    assert course_main(["collect", "--course", str(tmp_path), "--archive", "x.zip"]) == 2


def test_a_lab_timed_alone_is_graded_after_the_others_with_nothing_beside_it(tmp_path: Path, monkeypatch) -> None:
    """Lab 10's packing check times two trials per core against one: with JOBS=2 a classmate's kernel
    beside it changed that ratio (0.80 < 1.15), so its submissions run after the rest, one at a time."""
    import threading
    import time

    from gpulab.autograde.limits import SandboxResult
    from gpulab.confine import isolation
    from gpulab.labs import LABS

    alone = {lab.id for lab in LABS if lab.timed_alone}
    assert "10_search" in alone
    for student in ("ana", "ben", "cho"):
        for lab in ("00_setup", "10_search"):
            (tmp_path / "submitted" / student / lab).mkdir(parents=True)
    for lab in ("00_setup", "10_search"):
        (tmp_path / "source" / lab).mkdir(parents=True)
        (tmp_path / "source" / lab / f"{lab}.ipynb").write_text("{}")
    running: set[tuple[str, str]] = set()
    beside: list[tuple[tuple[str, str], set]] = []
    order: list[str] = []
    lock = threading.Lock()

    def fake_grade(course, template, spec, lab, student, *rest):
        with lock:
            if lab in alone or any(other in alone for _, other in running):
                beside.append(((student, lab), set(running)))
            running.add((student, lab))
            order.append(lab)
        time.sleep(0.05)
        with lock:
            running.discard((student, lab))
        return SandboxResult(student, lab, status="ok")

    from gpulab.autograde import plan as planning
    from gpulab.autograde import record
    from gpulab.autograde.runners import threads

    monkeypatch.setattr(threads, "grade_safely", fake_grade)
    monkeypatch.setattr(grading_run, "prepare_lab", lambda course, lab, root, *a: grading_run.LabRun(lab, 1, root / "e"))
    monkeypatch.setattr(grading_run, "note_copies", lambda course, rows: None)
    monkeypatch.setattr(planning, "ensure_released", lambda course, labs: None)
    monkeypatch.setattr(grading_run.gradebook, "backup", lambda course: None)
    monkeypatch.setattr(grading_run.gradebook, "snapshot", lambda course, dst: Path(dst).touch())
    monkeypatch.setattr(record.gradebook, "merge", lambda course, result, max_bytes: (1.0, 1.0))
    monkeypatch.setattr(grading_run.integrity, "lab_spec", lambda *a: {})
    monkeypatch.setattr(record, "_keep_log", lambda course, result: None)
    limits = grading_run.Limits(allow_weaker=True)  # the fake grader needs no sandbox
    rows = grading_run.grade(tmp_path, jobs=3, limits=limits, progress=False, plan=isolation.Plan(landlock_needed=False))
    assert len(rows) == 6
    assert order[3:] == ["10_search"] * 3, order
    assert all(not others for _, others in beside), beside


def test_parallel_graders_get_disjoint_cpu_sets_of_one_size() -> None:
    assert planning.cpu_slots(2, [0, 1]) == [[0], [1]]
    assert planning.cpu_slots(1, [0, 1, 2, 3]) == [[0, 1, 2, 3]]
    assert planning.cpu_slots(2, [0, 1, 2, 3, 4]) == [[0, 1], [2, 3]]
    assert planning.cpu_slots(3, [0, 1]) == [[0], [1], [0]]  # more jobs than CPUs: they share, one each
