"""gpulab.i18n.build: the Korean course root changes markdown only, and only where a translation is
current; the repository's catalogues pass make i18n-check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from conftest import COURSE, REPO

from gpulab.i18n import build, catalog


def _course(tmp_path: Path) -> Path:
    course = tmp_path / "course"
    (course / "source" / "lab").mkdir(parents=True)
    shutil.copy(COURSE / "nbgrader_config.py", course)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Lab", id="title"),
                nbformat.v4.new_code_cell("def f():\n    return 1", id="answer",
                                          metadata={"nbgrader": {"grade_id": "f", "solution": True, "grade": False,
                                                                 "locked": False, "schema_version": 3}}),
                nbformat.v4.new_markdown_cell("Run it twice.", id="prose")]
    nbformat.write(nb, str(course / "source" / "lab" / "lab.ipynb"))
    (course / "source" / "lab" / "data.txt").write_text("kept")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Header", id="h")]),
                   str(course / "source" / "other.ipynb"))
    return course


def test_only_current_translations_replace_markdown_and_code_is_byte_identical(tmp_path):
    course = _course(tmp_path)
    po = catalog.catalogue_path(course, "ko", "lab")
    catalog.update(course / "source" / "lab" / "lab.ipynb", po, "ko")
    cat = catalog.read(po, "ko")
    entries = catalog.entries(cat)
    entries["title"].string = "# 실습"
    entries["prose"].string = "두 번 실행합니다."
    entries["prose"].flags.add(catalog.FUZZY)  # not revised since the English changed: English stays
    catalog.write(po, cat)
    out = tmp_path / "ko"
    assert build.build(course, "ko", out) == ["other"]
    en = nbformat.read(str(course / "source" / "lab" / "lab.ipynb"), as_version=4)
    ko = nbformat.read(str(out / "source" / "lab" / "lab.ipynb"), as_version=4)
    assert [c.source for c in ko.cells] == ["# 실습", "def f():\n    return 1", "Run it twice."]
    assert [(c.id, c.cell_type, c.metadata) for c in ko.cells] == [(c.id, c.cell_type, c.metadata) for c in en.cells]
    assert ko.metadata["gpulab"]["lang"] == "ko"
    assert (out / "source" / "lab" / "data.txt").read_text() == "kept"
    other = nbformat.read(str(out / "source" / "other.ipynb"), as_version=4)
    assert other.cells[0].metadata["gpulab"] == {"untranslated": True} and other.cells[1].source == "# Header"


def test_a_second_build_rewrites_nothing_and_removes_what_the_source_lost(tmp_path):
    course = _course(tmp_path)
    out = tmp_path / "ko"
    build.build(course, "ko", out)
    (out / "release").mkdir()  # what nbgrader made there stays
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    build.build(course, "ko", out)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps
    (course / "source" / "lab" / "data.txt").unlink()
    build.build(course, "ko", out)
    assert not (out / "source" / "lab" / "data.txt").exists() and (out / "release").is_dir()


def test_the_repository_catalogues_pass_the_check():
    """make i18n-check, as make test runs it: every catalogue complete and current."""
    done = subprocess.run([sys.executable, "-m", "gpulab.i18n", "check", "--lang", "ko"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
