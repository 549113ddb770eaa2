"""The nbgrader pipeline, end to end, for every lab folder in notebooks/source.

For each lab, in a private copy of the course root:
1. ``nbgrader generate_assignment`` succeeds;
2. the *source* notebook (the solutions), submitted as a student, autogrades to full marks with no
   cell raising an error;
3. the generated *release* notebook (the student's starting point) autogrades without crashing
   (every cell runs, no timeout, no dead kernel) and scores zero.

New labs are picked up automatically, so every lab is held to this.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import nbformat
import pytest

from conftest import COURSE, LAB_TIMINGS
from gpulab.course.grade import scores_from_gradebook
from gpulab.course.nbgrader_cli import find_labs, nbgrader

LABS = find_labs(COURSE)
CRASHES = {"DeadKernelError", "CellTimeoutError", "TimeoutError", "KernelDied"}


def _course_copy(dst: Path) -> Path:
    shutil.copytree(COURSE / "source", dst / "source")
    shutil.copy(COURSE / "nbgrader_config.py", dst / "nbgrader_config.py")
    return dst


def _run(course: Path, *args: str) -> None:
    proc = nbgrader(course, *args, timeout=1200)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def _errors(nb_path: Path) -> list[tuple[int, str, str]]:
    nb = nbformat.read(str(nb_path), as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.execution_count is None and cell.source.strip():
            out.append((i, "NotExecuted", cell.source[:80]))
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                out.append((i, o.ename, o.evalue[:300]))
    return out


def _manual_points(course: Path, lab: str, student: str) -> float:
    """Points of the cells that autograde leaves to the instructor (written answers)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="") as gb:
        sub = gb.find_submission(lab, student)
        return float(sum(g.max_score for nb in sub.notebooks for g in nb.grades
                         if g.auto_score is None and g.manual_score is None))


@pytest.mark.notebook
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("lab", LABS)
def test_lab_pipeline(lab: str, tmp_path: Path) -> None:
    course = _course_copy(tmp_path)
    timings = LAB_TIMINGS.setdefault(lab, {})

    t0 = time.perf_counter()
    _run(course, "generate_assignment", lab, "--force")
    timings["generate"] = time.perf_counter() - t0
    assert any((course / "release" / lab).glob("*.ipynb")), "generate_assignment wrote no release notebook"

    shutil.copytree(course / "source" / lab, course / "submitted" / "solution" / lab)
    shutil.copytree(course / "release" / lab, course / "submitted" / "student" / lab)

    t0 = time.perf_counter()
    _run(course, "autograde", lab, "--student", "solution", "--force")
    timings["source"] = time.perf_counter() - t0
    for nb in (course / "autograded" / "solution" / lab).glob("*.ipynb"):
        errors = _errors(nb)
        assert not errors, f"the source notebook {nb.name} raised in cells: {errors}"
    score, max_score = scores_from_gradebook(course, lab, "solution")
    assert max_score > 0, f"{lab} has no graded cells"
    manual = _manual_points(course, lab, "solution")  # written answers wait for the instructor
    assert score == max_score - manual, \
        f"{lab} source notebook scored {score}/{max_score} ({manual} to grade by hand); it must get full marks"

    t0 = time.perf_counter()
    _run(course, "autograde", lab, "--student", "student", "--force")
    timings["release"] = time.perf_counter() - t0
    for nb in (course / "autograded" / "student" / lab).glob("*.ipynb"):
        crashed = [e for e in _errors(nb) if e[1] in CRASHES or e[1] == "NotExecuted"]
        assert not crashed, f"the release notebook {nb.name} crashed: {crashed}"
    score, _ = scores_from_gradebook(course, lab, "student")
    assert score == 0, f"{lab} release notebook scored {score} before any exercise was done; tests must fail on the stubs"
