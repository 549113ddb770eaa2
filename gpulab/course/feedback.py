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
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import nbformat
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import ClearHiddenTests
from traitlets import Bool

from gpulab.course import integrity
from gpulab.course.links import read_regular
from gpulab.course.nbgrader_cli import find_labs, nbgrader

BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"


REDACTED = "[removed: this output quoted the instructor's notebook]"


def secret_lines(specs: dict[str, integrity.NotebookSpec], source_dir: Path | None = None,
                 min_chars: int = 12) -> set[str]:
    """Lines that only the instructor's notebook holds: hidden tests (from the gradebook) and
    solutions (from ``source_dir``'s notebooks, when given), whitespace collapsed."""
    lines = hidden_lines(specs, min_chars) | {BEGIN, END, "BEGIN SOLUTION", "END SOLUTION"}
    visible = {re.sub(r"\s+", " ", ln).strip() for spec in specs.values() for cell in spec.cells
               for ln in integrity.release_source(cell.source).splitlines()}
    for name in specs:
        path = source_dir / f"{name}.ipynb" if source_dir else None
        if path is None or not path.is_file():
            continue
        for cell in nbformat.read(str(path), as_version=4).cells:
            inside = False
            for line in cell.source.splitlines():
                norm = re.sub(r"\s+", " ", line).strip()
                if "BEGIN SOLUTION" in line or BEGIN in line:
                    inside = True
                elif "END SOLUTION" in line or END in line:
                    inside = False
                elif inside and len(norm) >= min_chars and norm not in visible:
                    lines.add(norm)
    return lines


def redact(text: str, lines: set[str]) -> str:
    """``text`` with every line that shows one of ``lines`` replaced by :data:`REDACTED`."""
    if not lines or not text:
        return text
    out = []
    for line in text.splitlines(keepends=True):
        norm = re.sub(r"\s+", " ", _ANSI.sub("", line))
        out.append(REDACTED + "\n" if any(secret in norm for secret in lines) else line)
    return "".join(out)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class HideHiddenTests(ClearHiddenTests):
    """Feedback preprocessor: remove hidden test regions; in test cells keep only each error's
    message (no traceback, no stream output); in every output, replace any line that quotes the
    instructor's notebook (hidden tests, solutions), whatever the kernel printed."""

    enforce_metadata = Bool(False, help="feedback never fails on a cell that is not a grade cell").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: Any) -> tuple[NotebookNode, Any]:
        from gpulab.course.gradebook import db_url

        info = (resources or {}).get("nbgrader", {})
        self._secrets: set[str] = set()
        lab = info.get("assignment")
        if lab:
            url = info.get("db_url") or db_url(Path.cwd())
            try:
                specs = integrity.lab_spec(url, lab)
            except Exception:  # noqa: BLE001 - no gradebook entry: the hidden regions are still cut below
                specs = {}
            self._secrets = secret_lines(specs, Path.cwd() / "source" / lab)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int) -> tuple[NotebookNode, Any]:
        try:
            removed = self._remove_hidden_test_region(cell)
        except RuntimeError:  # unbalanced markers: drop everything from the first BEGIN on
            cell.source = cell.source.split(self.begin_test_delimeter)[0].rsplit("\n", 1)[0]
            removed = True
        if cell.cell_type != "code":
            return cell, resources
        meta = cell.metadata.get("nbgrader", {})
        test = removed or (bool(meta.get("grade")) and not meta.get("solution"))
        secrets = getattr(self, "_secrets", set())
        kept = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if test and kind == "stream":
                continue  # what the student's code printed while the tests ran
            if kind == "error":
                out["evalue"] = redact(str(out.get("evalue", "")), secrets)
                if test:
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out['evalue']}",
                                        "(the traceback is not shown: this is a test cell)"]
                else:
                    out["traceback"] = [redact(str(t), secrets) for t in out.get("traceback", [])]
            elif kind == "stream":
                out["text"] = redact(str(out.get("text", "")), secrets)
            elif kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                for mime in list(data):
                    if mime.startswith("text/") or mime.endswith(("json", "javascript")):
                        data[mime] = redact(data[mime] if isinstance(data[mime], str) else "".join(data[mime]), secrets)
            kept.append(out)
        cell.outputs = kept
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


def submitted_lines(folder: Path, max_bytes: int = 100 * 2**20) -> set[str]:
    """Every line of every notebook the student handed in (``submitted/<student>/<lab>/``): a hidden line
    the student wrote there (``from gpulab.grading import lab00``) is no secret on their own page. Only
    regular files are read (a submission may hold links and FIFOs named ``*.ipynb``)."""
    own: set[str] = set()
    for path in folder.glob("*.ipynb"):
        data = read_regular(path, max_bytes)
        try:
            cells = json.loads(data).get("cells", []) if data is not None else []
        except (ValueError, AttributeError):
            continue
        for cell in cells if isinstance(cells, list) else []:
            source = cell.get("source", "") if isinstance(cell, dict) else ""
            for line in ("".join(source) if isinstance(source, list) else str(source)).splitlines():
                own.add(re.sub(r"\s+", " ", line).strip())
    return own


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
        lines = hidden_lines(specs)  # (solutions are no secret on the page: a student's own code may match them)
        for page in sorted(course.glob(f"feedback/*/{name}/*.html")):
            student = page.parent.parent.name
            found = leaks(page.read_text(errors="replace"), lines - submitted_lines(course / "submitted" / student / name))
            if found:
                page.unlink()  # never leave a page with hidden tests where release_feedback would find it
                entry["leaks"][str(page)] = found
            else:
                entry["pages"] += 1
        entry["notes"] = _note_pages(course, name, sorted(specs))
    return report
