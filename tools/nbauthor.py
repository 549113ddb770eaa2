"""Build and tidy nbgrader source notebooks from Python (a maintainer's tool, not part of gpulab).

The ``.ipynb`` under ``notebooks/source/<lab>/`` is the only copy anyone edits: open it in
JupyterLab (View → Cell Toolbar → Create Assignment), or build/rewrite it from a script with the
helpers here, which fill in nbgrader's cell metadata correctly::

    import sys; sys.path.insert(0, "tools")
    from nbauthor import md, code, solution, tests, answer, write
    write("notebooks/source/00_setup/00_setup.ipynb", [
        md("# Lab 00"),
        code("import gpulab"),
        solution("def f(x):\\n    ### BEGIN SOLUTION\\n    return x\\n    ### END SOLUTION", "f_impl"),
        tests("'''f returns its input.'''\\nassert f(1) == 1", "f_identity", points=1),
    ])

    python tools/nbauthor.py strip notebooks/source/*/*.ipynb   # drop outputs before committing
    python tools/nbauthor.py show NOTEBOOK GRADE_ID              # print one cell's source
    python tools/nbauthor.py set NOTEBOOK GRADE_ID FILE          # replace it (metadata kept)
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

KERNEL = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def _meta(grade_id: str, *, grade: bool, solution: bool, locked: bool, points: float | None = None) -> dict:
    m = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution, "task": False}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def md(text: str) -> nbformat.NotebookNode:
    """A plain markdown cell."""
    return nbformat.v4.new_markdown_cell(text.strip("\n"))


def code(src: str) -> nbformat.NotebookNode:
    """A plain code cell (students may run and edit it)."""
    return nbformat.v4.new_code_cell(src.strip("\n"))


def solution(src: str, grade_id: str) -> nbformat.NotebookNode:
    """An exercise cell: the part between ``### BEGIN SOLUTION`` / ``### END SOLUTION`` is removed
    from the student's copy and replaced by ``raise NotImplementedError()``."""
    cell = nbformat.v4.new_code_cell(src.strip("\n"))
    cell.metadata.update(_meta(grade_id, grade=False, solution=True, locked=False))
    return cell


def tests(src: str, grade_id: str, points: float = 1) -> nbformat.NotebookNode:
    """A locked, autograded test cell. Put hidden tests between ``### BEGIN HIDDEN TESTS`` and
    ``### END HIDDEN TESTS``; start with a one-line docstring saying what is checked."""
    cell = nbformat.v4.new_code_cell(src.strip("\n"))
    cell.metadata.update(_meta(grade_id, grade=True, solution=False, locked=True, points=points))
    return cell


def answer(text: str, grade_id: str, points: float = 1) -> nbformat.NotebookNode:
    """A written answer, graded by hand: the part between ``### BEGIN SOLUTION`` / ``### END SOLUTION``
    (a model answer and the instructor's rubric) becomes "YOUR ANSWER HERE" in the student's copy."""
    cell = nbformat.v4.new_markdown_cell(text.strip("\n"))
    cell.metadata.update(_meta(grade_id, grade=True, solution=True, locked=False, points=points))
    return cell


def readonly(src: str, grade_id: str) -> nbformat.NotebookNode:
    """A locked code cell that students cannot edit (setup that tests depend on)."""
    cell = nbformat.v4.new_code_cell(src.strip("\n"))
    cell.metadata.update(_meta(grade_id, grade=False, solution=False, locked=True))
    return cell


def write(path: str | Path, cells: list) -> None:
    """Write a source notebook (no outputs)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata = dict(KERNEL)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i:03d}"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    nbformat.validate(nb)
    nbformat.write(nb, str(path))


def strip(path: str | Path) -> None:
    """Remove outputs and execution counts in place."""
    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nbformat.write(nb, str(path))


def find(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    """The cell of ``nb`` whose nbgrader ``grade_id`` is ``grade_id`` (KeyError if none)."""
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(f"no cell with grade_id {grade_id!r}")


def set_source(path: str | Path, grade_id: str, source: str) -> None:
    """Replace the source of one nbgrader cell, keeping its metadata and id."""
    nb = nbformat.read(str(path), as_version=4)
    find(nb, grade_id).source = source.strip("\n")
    nbformat.validate(nb)
    nbformat.write(nb, str(path))


if __name__ == "__main__":
    usage = "usage: python tools/nbauthor.py strip NOTEBOOK... | show NOTEBOOK GRADE_ID | set NOTEBOOK GRADE_ID FILE"
    if len(sys.argv) < 3:
        sys.exit(usage)
    if sys.argv[1] == "strip":
        for p in sys.argv[2:]:
            strip(p)
            print(f"stripped {p}")
    elif sys.argv[1] == "show" and len(sys.argv) == 4:
        print(find(nbformat.read(sys.argv[2], as_version=4), sys.argv[3]).source)
    elif sys.argv[1] == "set" and len(sys.argv) == 5:
        set_source(sys.argv[2], sys.argv[3], Path(sys.argv[4]).read_text())
        print(f"replaced {sys.argv[3]} in {sys.argv[2]}")
    else:
        sys.exit(usage)
