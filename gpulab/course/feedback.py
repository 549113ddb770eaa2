"""HTML feedback for every student, with the hidden tests kept hidden.

    python -m gpulab.course feedback --course notebooks [--lab 00_setup]

nbgrader's ``generate_feedback`` renders the *autograded* notebook, and autograde has put the
hidden tests back into every test cell: out of the box the feedback shows them, and the
traceback of a failing hidden test shows the failing line too. Two layers stop that:

1. :class:`HideHiddenTests`, in ``c.GenerateFeedback.preprocessors`` (``nbgrader_config.py``,
   so formgrader's "generate feedback" button uses it too), deletes each hidden region with
   nbgrader's own ``ClearHiddenTests`` code and cuts the traceback of an error in such a cell
   down to its last line (``GradingError: <the message written for the student>``).
2. :func:`feedback` then reads every HTML file it wrote as text and looks for each line of each
   hidden region; a file that still shows one is deleted and reported, never released.

A student whose submission could not be graded at all (not JSON, wall-clock limit) gets a short
page with the note from ``grades.csv`` instead of a notebook.
"""

from __future__ import annotations

import csv
import html
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import ClearHiddenTests
from traitlets import Bool

from gpulab.course import integrity
from gpulab.course.nbgrader_cli import find_labs, nbgrader

BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"


class HideHiddenTests(ClearHiddenTests):
    """Feedback preprocessor: remove hidden test regions and the tracebacks that would quote them."""

    enforce_metadata = Bool(False, help="feedback never fails on a cell that is not a grade cell").tag(config=True)

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int) -> tuple[NotebookNode, Any]:
        try:
            removed = self._remove_hidden_test_region(cell)
        except RuntimeError:  # unbalanced markers: drop everything from the first BEGIN on
            cell.source = cell.source.split(self.begin_test_delimeter)[0].rsplit("\n", 1)[0]
            removed = True
        if removed and cell.cell_type == "code":
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}",
                                        "(the traceback is not shown: this test cell has hidden tests)"]
        return cell, resources


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def html_text(page: str) -> str:
    """The visible text of an HTML page, whitespace collapsed (code is split into many spans by
    syntax highlighting, so searching the raw HTML for a line of code finds nothing)."""
    parser = _Text()
    parser.feed(page)
    return re.sub(r"\s+", " ", html.unescape("".join(parser.parts)))


def hidden_lines(specs: dict[str, integrity.NotebookSpec], min_chars: int = 12) -> set[str]:
    """Every line inside a hidden region of the lab's cells that appears nowhere outside one."""
    hidden, visible = set(), set()
    for spec in specs.values():
        for cell in spec.cells:
            inside = False
            for line in cell.source.splitlines():
                norm = re.sub(r"\s+", " ", line).strip()
                if BEGIN in line:
                    inside = True
                elif END in line:
                    inside = False
                elif norm:
                    (hidden if inside else visible).add(norm)
    return {ln for ln in hidden - visible if len(ln) >= min_chars}


def leaks(page: str, lines: set[str]) -> list[str]:
    """The hidden lines that ``page`` (HTML) shows."""
    text = html_text(page)
    return sorted(ln for ln in lines if ln in text)


def _note_pages(course: Path, lab: str, notebooks: list[str]) -> int:
    """A short page for each student in grades.csv who has no autograded notebook for ``lab``."""
    path = course / "grades.csv"
    if not path.exists():
        return 0
    written = 0
    with open(path) as fh:
        for row in csv.DictReader(fh):
            if row["lab"] != lab or (course / "autograded" / row["student"] / lab).exists():
                continue
            out = course / "feedback" / row["student"] / lab
            out.mkdir(parents=True, exist_ok=True)
            body = (f"<h1>{html.escape(lab)}: {html.escape(row['score'])} / {html.escape(row['max_score'])}</h1>"
                    f"<p>Your submission could not be graded: {html.escape(row['notes'])}</p>")
            for name in notebooks:
                (out / f"{name}.html").write_text(f"<!DOCTYPE html><html><body>{body}</body></html>\n")
            written += 1
    return written


def feedback(course: str | Path, lab: str | None = None) -> dict[str, dict[str, Any]]:
    """``nbgrader generate_feedback`` for each lab, then a leak check of every page.

    Returns:
        {lab: {"pages": n, "notes": n, "leaks": {html_path: [hidden lines]}, "error": str | None}}
    """
    from gpulab.course.gradebook import db_url

    course = Path(course).resolve()
    labs = [lab] if lab else find_labs(course)
    report: dict[str, dict[str, Any]] = {}
    for name in labs:
        entry: dict[str, Any] = {"pages": 0, "notes": 0, "leaks": {}, "error": None}
        report[name] = entry
        if not (course / "autograded").is_dir() or not any((course / "autograded").glob(f"*/{name}")):
            entry["error"] = "nothing autograded yet: run `make grade` first"
            continue
        proc = nbgrader(course, "generate_feedback", name, "--force")
        if proc.returncode != 0:
            entry["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1][-300:]
        specs = integrity.lab_spec(db_url(course), name)
        lines = hidden_lines(specs)
        for page in sorted(course.glob(f"feedback/*/{name}/*.html")):
            found = leaks(page.read_text(errors="replace"), lines)
            if found:
                page.unlink()  # never leave a page with hidden tests where release_feedback would find it
                entry["leaks"][str(page)] = found
            else:
                entry["pages"] += 1
        entry["notes"] = _note_pages(course, name, sorted(specs))
    return report
