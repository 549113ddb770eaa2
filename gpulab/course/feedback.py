"""HTML feedback for every student, built from what they handed in (see :mod:`gpulab.course.feedback_page`).

``make feedback`` runs nbgrader's ``generate_feedback`` for each lab, whose first preprocessor
(:class:`~gpulab.course.feedback_page.FromSubmission`, in ``c.GenerateFeedback.preprocessors``, so
formgrader's button does the same) replaces each autograded notebook by one built from the submitted
notebook, the released test cells and the grader's verdicts: nothing the graded kernel printed,
displayed or raised reaches a page, so no page needs checking for hidden tests, however encoded. A
notebook nbgrader cannot render gets a page with a note; so does a submission that could not be
graded at all (the note from ``grades.csv``).

:func:`hidden_lines` and :func:`html_text` are for the tests (and an instructor's own look): the lines
only hidden regions hold, and a page's visible text.
"""

from __future__ import annotations

import csv
import glob
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import nbformat

from gpulab.accounts.students import alias, from_csv
from gpulab.autograde.box import integrity
from gpulab.autograde.box.links import read_regular
from gpulab.autograde.nbgrader import find_labs, nbgrader

BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"


def _ws(line: str) -> str:
    return re.sub(r"\s+", " ", line).strip()


def _marked(source: str) -> list[tuple[bool, str]]:
    """(inside a hidden region, the line whitespace-collapsed) for each line between the markers."""
    out, inside = [], False
    for line in source.splitlines():
        if BEGIN in line:
            inside = True
        elif END in line:
            inside = False
        else:
            out.append((inside, _ws(line)))
    return out


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in _BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _BLOCKS:
            self.parts.append("\n")


_BLOCKS = {"div", "pre", "p", "br", "tr", "li", "h1", "h2", "h3", "h4", "h5", "h6", "table", "section"}


def html_text(page: str, lines: bool = False) -> str:
    """The visible text of an HTML page (syntax highlighting splits code into spans), whitespace
    collapsed or, with ``lines``, line breaks kept."""
    parser = _Text()
    parser.feed(page)
    text = html.unescape("".join(parser.parts))
    return text if lines else re.sub(r"\s+", " ", text)


def hidden_lines(specs: dict[str, integrity.NotebookSpec], min_chars: int = 12) -> set[str]:
    """Every line inside a hidden region of the lab's cells that appears nowhere outside one."""
    hidden, visible = set(), set()
    for spec in specs.values():
        for cell in spec.cells:
            for inside, ln in _marked(cell.source):
                if ln:
                    (hidden if inside else visible).add(ln)
    return {ln for ln in hidden - visible if len(ln) >= min_chars}


def leaks(page: str, lines: set[str], own: set[str] = frozenset()) -> list[str]:
    """The ``lines`` (less ``own``) that ``page`` (HTML) shows as a line of its text, whitespace collapsed:
    a plain look, for the tests; nothing is decoded (the page is built so that it has nothing to hide)."""
    shown = {_ws(ln) for ln in html_text(page, lines=True).splitlines()}
    return sorted(ln for ln in lines if _ws(ln) in shown and ln not in own)


def submitted_folder(course: Path, student: str, lab: str) -> Path:
    """``submitted/<id>/<lab>/`` of the student nbgrader knows as ``student`` (the id, or its alias)."""
    folder = course / "submitted" / student / lab
    if folder.is_dir() or not (course / "submitted").is_dir():
        return folder
    for path in (course / "submitted").iterdir():
        if alias(path.name) == student:
            return path / lab
    return folder


def submitted_lines(folder: Path, max_bytes: int = 100 * 2**20) -> set[str]:
    """Every line of the regular ``*.ipynb`` files the student handed in (``from gpulab.grading import
    lab00``, written by the student, is no secret on their own page)."""
    own: set[str] = set()
    for path in folder.glob("*.ipynb"):
        data = read_regular(path, max_bytes)
        try:
            cells = json.loads(data).get("cells", []) if data is not None else []
        except (ValueError, AttributeError, RecursionError):  # not a notebook, or nested past Python's stack
            continue
        for cell in cells if isinstance(cells, list) else []:
            source = cell.get("source", "") if isinstance(cell, dict) else ""
            for line in ("".join(source) if isinstance(source, list) else str(source)).splitlines():
                own.add(_ws(line))
    return own


def _note_pages(course: Path, lab: str, notebooks: list[str]) -> int:
    """A short page for each student in grades.csv who has no autograded notebook for ``lab``."""
    path = course / "grades.csv"
    if not path.exists():
        return 0
    written = 0
    with open(path) as fh:
        for row in csv.DictReader(fh):
            student = alias(from_csv(row["student"]))
            if row["lab"] != lab or (course / "autograded" / student / lab).exists():
                continue
            _page(
                course,
                student,
                lab,
                notebooks,
                f"<h1>{html.escape(lab)}: {html.escape(row['score'])} / {html.escape(row['max_score'])}</h1>"
                f"<p>Your submission could not be graded: {html.escape(row['notes'])}</p>",
            )
            written += 1
    return written


def readable(path: Path, max_bytes: int = 100 * 2**20) -> str | None:
    """Why nbgrader cannot be trusted to render ``path``, or None."""
    data = read_regular(path, max_bytes)
    if data is None:
        return "not a regular file of at most 100 MiB"
    try:
        nbformat.reads(data.decode("utf-8"), as_version=4)
    except RecursionError:
        return "nested too deeply to read"
    except Exception as err:  # any other reason is a reason too
        return f"not a notebook ({type(err).__name__})"
    return None


def _render(course: Path, lab: str, student: str | None) -> str | None:
    """nbgrader's generate_feedback for the lab (one student, or all); why it failed, or None."""
    args = ["generate_feedback", lab, "--force"]
    if student is not None:
        args.append(f"--student={glob.escape(student)}")
    proc = nbgrader(course, *args)
    if proc.returncode != 0:
        return ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1][-300:]
    return None


def _page(course: Path, student: str, lab: str, notebooks: list[str], body: str) -> None:
    """A short page of ``body`` in place of each notebook's feedback."""
    out = course / "feedback" / student / lab
    out.mkdir(parents=True, exist_ok=True)
    for name in notebooks:
        (out / f"{name}.html").write_text(f"<!DOCTYPE html><html><body>{body}</body></html>\n")


def feedback(course: str | Path, lab: str | None = None) -> dict[str, dict[str, Any]]:
    """``nbgrader generate_feedback`` for each lab (pages built from the submissions): {lab: {"pages": n,
    "notes": n, "failed": {student: why}, "error": str | None, "leaks": {}}} ("leaks" is always empty:
    no page is made from the graded run, so none is checked or withheld)."""
    from gpulab.autograde.gradebook import db_url

    course = Path(course).resolve()
    labs = [lab] if lab else find_labs(course)
    report: dict[str, dict[str, Any]] = {}
    for name in labs:
        entry: dict[str, Any] = {"pages": 0, "notes": 0, "leaks": {}, "failed": {}, "error": None}
        report[name] = entry
        students = (
            sorted(p.parent.name for p in (course / "autograded").glob(f"*/{name}") if p.is_dir())
            if (course / "autograded").is_dir()
            else []
        )
        if not students:
            entry["error"] = "nothing autograded yet: run `make grade` first"
            continue
        notebooks = sorted(integrity.lab_spec(db_url(course), name))
        bad = {}
        for student in students:
            for nb in sorted((course / "autograded" / student / name).glob("*.ipynb")):
                why = readable(nb)
                if why:
                    bad[student] = f"{nb.name} is {why}"
        if bad or _render(course, name, None) is not None:
            # one page at a time: one notebook nbgrader cannot render must not cost the class its pages
            for student in students:
                why = bad.get(student) or _render(course, name, student)
                if why:
                    entry["failed"][student] = why
                    _page(
                        course,
                        student,
                        name,
                        notebooks,
                        f"<h1>{html.escape(name)}</h1><p>Your graded "
                        f"notebook could not be shown here: {html.escape(why)}.</p>",
                    )
        entry["pages"] = sum(
            1
            for s in students
            for n in notebooks
            if s not in entry["failed"] and (course / "feedback" / s / name / f"{n}.html").is_file()
        )
        entry["notes"] = _note_pages(course, name, notebooks)
    return report
