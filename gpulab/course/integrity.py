"""Check a submitted notebook against the gradebook before nbgrader grades it, and put back what
a student removed, so that every submission is graded against the original tests.

nbgrader already restores the *source* of an edited read-only cell (``OverwriteCells`` compares
the cell's checksum with the gradebook's and copies the original back) and its ``locked`` flag
and points. It does not, by default, put back a test cell the student **deleted**
(``OverwriteCells.add_missing_cells`` is off, and when on it raises ``KeyError`` if the cell
before the deleted one is gone too), and it does not restore a test cell's ``grade`` flag, so a
student who un-ticks "graded" in the cell toolbar makes nbgrader skip the test. This module fixes
both from the gradebook, and says what it found (the notes end up in ``grades.csv``).

    notes = repair_notebook(path, spec)   # spec = lab_spec(db_url, lab, source_dir)[notebook]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import ClearHiddenTests


class UnreadableNotebook(ValueError):
    """The file is not a notebook nbgrader can open; the message is the note for the student."""


@dataclass
class CellSpec:
    """One nbgrader cell as the gradebook recorded it at ``generate_assignment`` time."""

    name: str
    cell_type: str
    source: str
    checksum: str | None
    locked: bool
    grade: bool = False
    solution: bool = False
    task: bool = False
    points: float | None = None

    def metadata(self) -> dict:
        """The ``nbgrader`` cell metadata this cell must carry."""
        meta = {"grade": self.grade, "grade_id": self.name, "locked": self.locked, "schema_version": 3,
                "solution": self.solution, "task": self.task}
        if self.grade or self.task:
            meta["points"] = self.points
        return meta


@dataclass
class NotebookSpec:
    """The nbgrader cells of one notebook, in notebook order."""

    name: str
    cells: list[CellSpec] = field(default_factory=list)


def lab_spec(db_url: str, lab: str, source_dir: Path | None = None) -> dict[str, NotebookSpec]:
    """Every notebook of ``lab`` as the gradebook at ``db_url`` knows it.

    The gradebook keeps no cell order, so the order comes from the source notebook in
    ``source_dir`` when it is there (cells it lacks go last).
    """
    from nbgrader.api import Gradebook

    specs: dict[str, NotebookSpec] = {}
    with Gradebook(db_url, course_id="") as gb:
        for nb in gb.find_assignment(lab).notebooks:
            grades = {c.name: c for c in nb.grade_cells}
            tasks = {c.name: c for c in nb.task_cells}
            solutions = {c.name for c in nb.solution_cells}
            cells = {
                c.name: CellSpec(c.name, c.cell_type, c.source or "", c.checksum, bool(c.locked),
                                 grade=c.name in grades, solution=c.name in solutions, task=c.name in tasks,
                                 points=float((grades.get(c.name) or tasks.get(c.name)).max_score)
                                 if c.name in grades or c.name in tasks else None)
                for c in nb.source_cells}
            order = _source_order(source_dir / f"{nb.name}.ipynb") if source_dir else []
            ordered = [cells.pop(n) for n in order if n in cells] + list(cells.values())
            specs[nb.name] = NotebookSpec(nb.name, ordered)
    return specs


def _source_order(path: Path) -> list[str]:
    if not path.exists():
        return []
    nb = nbformat.read(str(path), as_version=4)
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "grade_id" in c.metadata.get("nbgrader", {})]


def read_notebook(path: Path) -> NotebookNode:
    """Read a submitted notebook.

    Raises:
        UnreadableNotebook: when it is not JSON, or not a notebook; the message says what to do.
    """
    text = path.read_bytes()
    try:
        json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise UnreadableNotebook(f"{path.name} is not valid JSON ({str(err).splitlines()[0][:80]}); "
                                 "scored 0, resubmit a notebook saved by Jupyter") from None
    except RecursionError:
        raise UnreadableNotebook(f"{path.name} is JSON nested too deeply to read; scored 0, resubmit the lab's "
                                 "notebook as Jupyter saved it") from None
    try:
        return nbformat.reads(text.decode(), as_version=4)
    except Exception as err:  # nbformat raises many kinds; all mean the same here
        raise UnreadableNotebook(f"{path.name} is JSON but not a Jupyter notebook ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0][:80]}); scored 0, resubmit the lab's notebook") from None


def release_source(source: str) -> str:
    """A cell's source as the student received it: nbgrader's ClearHiddenTests applied. (The
    gradebook's checksum is of the full source, hidden tests included, so nbgrader "restores"
    every test cell with hidden tests; comparing checksums would call every one of them edited.)"""
    cell = nbformat.v4.new_code_cell(source)
    try:
        ClearHiddenTests()._remove_hidden_test_region(cell)
    except RuntimeError:  # unbalanced markers in the instructor's cell: compare the full source only
        return source
    return cell.source


def _norm(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _points(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _new_cell(spec: CellSpec, nb: NotebookNode) -> NotebookNode:
    make = nbformat.v4.new_code_cell if spec.cell_type == "code" else nbformat.v4.new_markdown_cell
    cell = make(source=spec.source, metadata={"deletable": False, "editable": False, "nbgrader": spec.metadata()})
    if spec.checksum:
        cell.metadata.nbgrader["checksum"] = spec.checksum
    if nb.get("nbformat_minor", 0) < 5:
        cell.pop("id", None)  # cell ids exist from nbformat 4.5 on
    return cell


def repair(nb: NotebookNode, spec: NotebookSpec) -> list[str]:
    """Restore nbgrader flags and deleted test cells in ``nb`` (in place); return the notes."""
    notes: list[str] = []
    by_name = {c.name: c for c in spec.cells}
    present: dict[str, int] = {}
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        name = meta.get("grade_id")
        if name not in by_name or name in present:
            continue  # unknown ids and duplicates: nbgrader's OverwriteCells / DeduplicateIds handle them
        present[name] = i
        want = by_name[name]
        expected = want.metadata()
        changed = [k for k in ("grade", "solution", "task", "locked") if bool(meta.get(k, False)) != expected[k]]
        if "points" in expected and _points(meta.get("points")) != expected["points"]:
            changed.append("points")
        if changed:
            notes.append(f"cell {name}: nbgrader flags {', '.join(changed)} were changed; restored")
            meta.update(expected)
            cell.metadata["nbgrader"] = meta
        kind = "test cell" if want.grade else "read-only cell"
        if want.locked and cell.cell_type != want.cell_type:
            notes.append(f"{kind} {name} was turned into a {cell.cell_type} cell; graded with the original")
        elif want.locked and _norm(cell.source) not in (_norm(want.source), _norm(release_source(want.source))):
            notes.append(f"{kind} {name} was edited; graded with the original")
    order = [c.name for c in spec.cells]
    for pos, want in enumerate(spec.cells):
        if not want.grade or want.name in present:
            continue
        before = [present[n] for n in order[:pos] if n in present]
        after = [present[n] for n in order[pos + 1:] if n in present]
        at = max(before) + 1 if before else (min(after) if after else len(nb.cells))
        nb.cells.insert(at, _new_cell(want, nb))
        present = {n: (i + 1 if i >= at else i) for n, i in present.items()}
        present[want.name] = at
        notes.append(f"test cell {want.name} was deleted; restored from the gradebook")
    return notes


def repair_notebook(path: Path, spec: NotebookSpec) -> list[str]:
    """:func:`repair` the notebook file at ``path`` in place.

    Raises:
        UnreadableNotebook: see :func:`read_notebook`.
    """
    nb = read_notebook(path)
    notes = repair(nb, spec)
    if notes:
        nbformat.write(nb, str(path))
    return notes
