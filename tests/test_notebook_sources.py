"""Lint the hand-edited source notebooks: the course conventions every lab must keep.

Fast (no execution): committed without outputs, unique grade_ids, at least three graded cells,
each test cell locked, opening with a one-line docstring and holding hidden tests, and the
notebook importing gpulab rather than defining library code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from conftest import COURSE

from gpulab.autograde.nbgrader import find_labs
from gpulab.labs import LABS as TABLE

LABS = find_labs(COURSE)


def _notebooks(lab: str) -> list[Path]:
    return sorted((COURSE / "source" / lab).glob("*.ipynb"))


def test_every_lab_in_the_table_has_a_folder_or_none_yet() -> None:
    unknown = set(LABS) - {lab.id for lab in TABLE}
    assert not unknown, f"lab folders missing from gpulab.labs.LABS: {unknown}"


@pytest.mark.parametrize("lab", LABS)
def test_source_notebook_conventions(lab: str) -> None:
    for path in _notebooks(lab):
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        with_outputs = [i for i, c in enumerate(code) if c.outputs or c.execution_count]
        assert not with_outputs, f"{path.name}: strip outputs before committing (tools/nbauthor.py strip)"
        ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate grade_ids {sorted(ids)}"
        graded = [c for c in code if c.metadata.get("nbgrader", {}).get("grade")]
        assert len(graded) >= 3, f"{path.name}: needs at least 3 graded cells, has {len(graded)}"
        for c in graded:
            gid = c.metadata["nbgrader"]["grade_id"]
            assert c.metadata["nbgrader"]["locked"], f"{gid}: test cells must be locked"
            assert c.metadata["nbgrader"].get("points", 0) > 0, f"{gid}: no points"
            body = ast.parse(c.source).body
            assert body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant), \
                f"{gid}: start the test cell with a one-line docstring saying what is checked"
            assert "\n" not in body[0].value.value.strip(), f"{gid}: the docstring must be one line"
            assert "### BEGIN HIDDEN TESTS" in c.source, f"{gid}: add hidden tests"
        assert "import gpulab" in code[0].source or "from gpulab" in code[0].source, \
            f"{path.name}: the first code cell should import gpulab (notebooks use the package, not local copies)"
        solutions = [c for c in code if c.metadata.get("nbgrader", {}).get("solution")]
        assert solutions, f"{path.name}: no exercise (solution) cells"
        for c in solutions:
            assert "### BEGIN SOLUTION" in c.source, f"{c.metadata['nbgrader']['grade_id']}: mark the solution"
