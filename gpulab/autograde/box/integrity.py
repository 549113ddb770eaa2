"""A submission checked before nbgrader grades it: what the student removed is put back from the
gradebook, and cells that only tampering needs are noted.

nbgrader's ``OverwriteCells`` restores an edited read-only cell's source, ``locked`` flag and
points, but not a test cell the student **deleted** (``add_missing_cells`` is off, and raises
``KeyError`` when the cell before is gone too), nor a test cell's ``grade`` flag (un-ticking
"graded" makes nbgrader skip the test). :func:`repair_notebook` restores both from the gradebook
and says what it found; :func:`scan_notes` is the static scan.
"""

from __future__ import annotations

import json
import re
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
    """Every notebook of ``lab`` as the gradebook at ``db_url`` knows it, in the order of the source
    notebook in ``source_dir`` (the gradebook keeps none; cells it lacks go last)."""
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
    """Read a submitted notebook (:class:`UnreadableNotebook`, saying what to do, when it is not one)."""
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
    """A cell's source as the student received it (nbgrader's ClearHiddenTests applied): the
    gradebook's checksum covers the hidden tests too, so it would call every such cell edited."""
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
    """:func:`repair` the notebook file at ``path`` in place (see :func:`read_notebook`)."""
    nb = read_notebook(path)
    notes = repair(nb, spec)
    if notes:
        nbformat.write(nb, str(path))
    return notes


# ---- the static scan: code that only tampering needs, a note for a human, never a score. No lab asks
# a student to touch IPython's machinery, the profiler, builtins, sys.modules, gpulab's or torch's
# attributes, a kernel client, links, terminal ioctls or its callers' frames. None of it can change a
# verdict (the grader decides from evidence, outside the kernel), but a submission that tries is
# worth a look, and patching gpulab's instruments changes what they measure in the kernel. ----
PATTERNS: dict[str, re.Pattern[str]] = {name: re.compile(rx) for name, rx in {
    "IPython events": r"get_ipython\(\)\s*\.\s*events|\bevents\s*\.\s*(register|unregister|callbacks|trigger)\b",
    "input transformers": r"input_transformer|ast_transformers",
    "displayhook": r"displayhook",
    "showtraceback": r"showtraceback",
    "ExecutionResult": r"ExecutionResult",
    "setprofile/settrace": r"\bset(profile|trace)(_all_threads)?\b",
    "writes to builtins": r"\b__builtins__\b|\bbuiltins\s*\.\s*\w+\s*=(?!=)|setattr\(\s*builtins\b",
    "writes to sys.modules": r"sys\s*\.\s*modules\s*(\[[^\]]*\]\s*=(?!=)|\.\s*(update|pop|setdefault|clear)\b)"
                             r"|del\s+sys\s*\.\s*modules",
    "attribute assignment on gpulab/torch modules": r"(?m)^\s*(gpulab|grading|torch(?!\.backends))(\s*\.\s*\w+)+"
                                                   r"\s*=(?!=)|setattr\(\s*(gpulab|grading|torch)\b",
    "jupyter_client": r"jupyter_client",
    "os.symlink": r"\bsymlink(_to)?\b|\bhardlink_to\b|\bos\s*\.\s*link\b|\bln\s+-s\b",
    "ioctl": r"\bioctl\b|TIOCSTI",
    "the callers' frames (the tests' source)": r"\bf_back\b|sys\s*\.\s*_getframe|\blinecache\b|"
                                               r"inspect\s*\.\s*(stack|currentframe|getouterframes|getsource)",
}.items()}


def scan_source(source: str) -> list[str]:
    """The names of the patterns ``source`` matches, in :data:`PATTERNS` order."""
    return [name for name, rx in PATTERNS.items() if rx.search(source)]


def scan_cell(cell: NotebookNode) -> list[str]:
    """:func:`scan_source` of a code cell the student may edit (locked cells are the course's)."""
    if cell.get("cell_type") != "code" or cell.get("metadata", {}).get("nbgrader", {}).get("locked"):
        return []
    return scan_source(cell.get("source", ""))


def scan_notes(nb: NotebookNode) -> list[str]:
    """One note per flagged cell: ``cell 7 (to_device_impl) uses displayhook, ExecutionResult ...``."""
    notes = []
    for i, cell in enumerate(nb.cells):
        found = scan_cell(cell)
        if found:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            label = f"cell {i} ({gid})" if gid else f"cell {i}"
            notes.append(f"{label} uses {', '.join(found)}, which only tampering needs; a human should review it")
    return notes
