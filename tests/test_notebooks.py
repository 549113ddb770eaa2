"""The grading pipeline, end to end, for every lab folder in notebooks/source, as ``make grade``
runs it: the reference run, then every submission in its sandbox with the references masked,
judged against the reference run.

For each lab, in a private copy of the course root:
1. ``nbgrader generate_assignment`` succeeds;
2. the reference run (the source notebook in a clean kernel) passes its own checks;
3. the *source* notebook (the solutions), submitted as a student, grades to full marks with no
   cell raising an error, with gpulab's references masked in its kernel;
4. the generated *release* notebook (the student's starting point) grades without crashing
   (every cell runs, no timeout, no dead kernel) and scores zero.

New labs are picked up automatically, so every lab is held to this.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from conftest import COURSE

from gpulab.autograde.gradebook import scores as scores_from_gradebook
from gpulab.autograde.limits import Limits
from gpulab.autograde.nbgrader import find_labs, nbgrader
from gpulab.autograde.run import grade
from gpulab.confine import isolation

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
    from gpulab.autograde.gradebook import manual_points

    return manual_points(course, lab, student)


def _confusing_failures(nb_path: Path) -> list[tuple[int, str, str]]:
    """What an unanswered lab must never show (issue 16): an error in a demo cell (Run All would stop
    there), a NameError anywhere (a test must name the missing exercise), or an ``Out[]`` holding an
    exception (a passing check reads as a failure, and nbgrader tries to read it as a score)."""
    nb = nbformat.read(str(nb_path), as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        for o in cell.get("outputs", []):
            named = o.get("ename") == "NameError" or "NameError:" in o.get("evalue", "")  # the grader's verdict quotes it
            # under the grader, a demo of an unanswered exercise stops naming it (the reference is masked)
            unanswered = o.get("ename") == "NotImplementedError" and "is not answered yet" in o.get("evalue", "")
            demo = not (meta.get("grade") or meta.get("solution"))
            if o.output_type == "error" and (named or demo and not unanswered):
                out.append((i, o.ename, o.evalue[:200]))
            shown = o.get("data", {}).get("text/plain", "") if o.output_type == "execute_result" else ""
            if re.match(r"\s*\w*(Error|Exception)\(", shown):
                out.append((i, "Out[] holds an exception", shown[:200]))
    return out


@pytest.mark.notebook
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("lab", LABS)
def test_lab_pipeline(lab: str, tmp_path: Path, record_property) -> None:
    course = _course_copy(tmp_path)
    timings: dict[str, float] = {}
    record_property("lab_timings", {lab: timings})  # filled in below; reported when the test ends

    t0 = time.perf_counter()
    _run(course, "generate_assignment", lab, "--force")
    timings["generate"] = time.perf_counter() - t0
    assert any((course / "release" / lab).glob("*.ipynb")), "generate_assignment wrote no release notebook"

    shutil.copytree(course / "source" / lab, course / "submitted" / "solution" / lab)
    shutil.copytree(course / "release" / lab, course / "submitted" / "student" / lab)

    t0 = time.perf_counter()
    rows = {r.student: r for r in grade(course, lab, jobs=2, limits=Limits(allow_weaker=True), progress=False,
                                        plan=_plan())}
    timings["graded (reference, source, release)"] = time.perf_counter() - t0
    assert set(rows) == {"solution", "student"}, rows
    assert "not graded" not in rows["solution"].notes, rows["solution"].notes
    for nb in (course / "autograded" / "solution" / lab).glob("*.ipynb"):
        errors = _errors(nb)
        assert not errors, f"the source notebook {nb.name} raised in cells: {errors}"
    score, max_score = scores_from_gradebook(course, lab, "solution")
    assert max_score > 0, f"{lab} has no graded cells"
    manual = _manual_points(course, lab, "solution")  # written answers wait for the instructor
    assert score == max_score - manual, \
        f"{lab} source notebook scored {score}/{max_score} ({manual} to grade by hand); it must get full marks"

    for nb in (course / "autograded" / "student" / lab).glob("*.ipynb"):
        crashed = [e for e in _errors(nb) if e[1] in CRASHES or e[1] == "NotExecuted"]
        assert not crashed, f"the release notebook {nb.name} crashed: {crashed}"
        confusing = _confusing_failures(nb)
        assert not confusing, f"the release notebook {nb.name} fails where a student would not expect it: {confusing}"
    score, _ = scores_from_gradebook(course, lab, "student")
    assert score == 0, f"{lab} release notebook scored {score} before any exercise was done; tests must fail on the stubs"


_PLAN: list[isolation.Plan] = []


def _plan() -> isolation.Plan:
    """The machine's sandbox layers, detected once per test session."""
    if not _PLAN:
        _PLAN.append(isolation.detect())
    return _PLAN[0]
