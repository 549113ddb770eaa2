"""gpulab.autograde.gradebook: a merge says how many points of written answers wait for the formgrader,
without changing a score."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import COURSE

from gpulab.autograde import gradebook
from gpulab.autograde.box import integrity
from gpulab.autograde.limits import SandboxResult
from gpulab.course.release import release

LAB = "09_sharding"  # has a written answer (a manually graded markdown cell)


@pytest.mark.timeout(300)
def test_merge_notes_the_written_answers_left_to_the_formgrader(tmp_path: Path) -> None:
    shutil.copytree(COURSE / "source" / LAB, tmp_path / "source" / LAB)
    shutil.copy(COURSE / "source" / "header.ipynb", tmp_path / "source")
    shutil.copy(COURSE / "nbgrader_config.py", tmp_path)
    release(tmp_path, LAB)
    specs = integrity.lab_spec(gradebook.db_url(tmp_path), LAB)
    written = sum(c.points for spec in specs.values() for c in spec.cells if c.grade and c.cell_type == "markdown")
    auto = {(name, c.name): c.points for name, spec in specs.items() for c in spec.cells
            if c.grade and c.cell_type == "code"}
    assert written > 0 and auto
    work = tmp_path / "work"
    work.mkdir()
    for name in specs:
        shutil.copy(COURSE / "source" / LAB / f"{name}.ipynb", work)
    result = SandboxResult("alice", LAB, grades=auto, autograded=work)  # every test passed; answers ungraded
    score, max_score = gradebook.merge(tmp_path, result)
    assert score == sum(auto.values()) and max_score == sum(auto.values()) + written
    assert result.notes == [f"{written:g} point(s) of written answers wait for manual grading in the formgrader"]
    failed = SandboxResult("bob", LAB, status="timeout", notes=["ran past the limit"])
    gradebook.merge(tmp_path, failed)
    assert failed.notes == ["ran past the limit"]  # nothing waits for a submission that was not graded
