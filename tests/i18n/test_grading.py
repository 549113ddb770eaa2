"""A Korean submission grades exactly as an English one: the same answers, typed into the Korean
release and into the English one, get the same score in the English course (issue 32)."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from conftest import COURSE

from gpulab.autograde.gradebook import scores as scores_from_gradebook
from gpulab.autograde.limits import Limits
from gpulab.autograde.nbgrader import nbgrader
from gpulab.autograde.run import grade
from gpulab.confine import isolation
from gpulab.i18n import build, catalog

pytestmark = pytest.mark.notebook
LAB = "08_oom"  # translated, and among the quickest labs to grade


def test_the_same_answers_score_the_same_in_korean_and_in_english(tmp_path: Path) -> None:
    if not catalog.catalogue_path(COURSE, "ko", LAB).exists():
        pytest.fail(f"{LAB} has no Korean catalogue: this test needs a translated lab")
    course = tmp_path / "en"
    shutil.copytree(COURSE / "source", course / "source")
    shutil.copy(COURSE / "nbgrader_config.py", course)
    korean = tmp_path / "ko"
    build.build(COURSE, "ko", korean)
    ko_nb = nbformat.read(str(korean / "source" / LAB / f"{LAB}.ipynb"), as_version=4)
    en_nb = nbformat.read(str(course / "source" / LAB / f"{LAB}.ipynb"), as_version=4)
    changed = [c.id for c, e in zip(ko_nb.cells, en_nb.cells) if c.source != e.source]
    assert len(changed) >= len(en_nb.cells) // 3, "the Korean notebook should differ in its markdown"
    assert all(c.cell_type == "markdown" for c in ko_nb.cells if c.id in changed)

    proc = nbgrader(course, "generate_assignment", LAB, "--force", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for student, src in (("english", course / "source" / LAB), ("korean", korean / "source" / LAB)):
        shutil.copytree(src, course / "submitted" / student / LAB)
    rows = {r.student: r for r in grade(course, LAB, jobs=2, limits=Limits(allow_weaker=True), progress=False,
                                        plan=isolation.detect())}
    scores = {s: scores_from_gradebook(course, LAB, s) for s in ("english", "korean")}
    assert scores["korean"] == scores["english"], (scores, rows["korean"].notes, rows["english"].notes)
    assert scores["english"][0] > 0, scores
