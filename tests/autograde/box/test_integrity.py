"""gpulab.autograde.box.integrity: deleted or edited test cells are restored from the gradebook's copy, and
unreadable notebooks get a note that names the fix."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from conftest import COURSE

from gpulab.autograde.box import integrity

SOURCE_NB = COURSE / "source" / "00_setup" / "00_setup.ipynb"


def _spec_from_source() -> integrity.NotebookSpec:
    """What the gradebook holds for lab 00, read from the source notebook (test cells in full)."""
    nb = nbformat.read(str(SOURCE_NB), as_version=4)
    cells = []
    for c in nb.cells:
        m = c.metadata.get("nbgrader")
        if m:
            cells.append(integrity.CellSpec(m["grade_id"], c.cell_type, c.source, None, m["locked"], grade=m["grade"],
                                             solution=m["solution"], points=m.get("points")))
    return integrity.NotebookSpec("00_setup", cells)


def _ids(nb: nbformat.NotebookNode) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]


def test_repair_leaves_an_untouched_notebook_alone() -> None:
    nb = nbformat.read(str(SOURCE_NB), as_version=4)
    nb.cells[-1].source += "\n"  # whitespace is not an edit
    assert integrity.repair(nb, _spec_from_source()) == []


def test_repair_restores_deleted_tests_in_place_and_reports_edits() -> None:
    spec = _spec_from_source()
    nb = nbformat.read(str(SOURCE_NB), as_version=4)
    before = _ids(nb)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                not in ("place_ranks_impl", "placement_for_machines", "triage_doctor_reports")]
    edited = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "to_device_nested")
    edited.source = "pass"
    unflag = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "backend_for_machines")
    unflag.metadata["nbgrader"]["grade"] = False
    found = integrity.repair(nb, spec)
    assert "test cell to_device_nested was edited; graded with the original" in found
    assert "cell backend_for_machines: nbgrader flags grade were changed; restored" in found
    assert sum("was deleted; restored" in n for n in found) == 2
    assert _ids(nb) == [i for i in before if i != "place_ranks_impl"]
    restored = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "triage_doctor_reports")
    assert restored.metadata["nbgrader"]["grade"] and restored.metadata["nbgrader"]["points"] == 2
    assert "BEGIN HIDDEN TESTS" in restored.source
    nbformat.validate(nb)


def test_unreadable_notebooks_get_a_note_that_names_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "00_setup.ipynb"
    bad.write_text('{"cells": [ oops')
    with pytest.raises(integrity.UnreadableNotebook, match="not valid JSON.*resubmit"):
        integrity.read_notebook(bad)
    bad.write_text('{"hello": 1}')
    with pytest.raises(integrity.UnreadableNotebook, match="JSON but not a Jupyter notebook"):
        integrity.read_notebook(bad)
