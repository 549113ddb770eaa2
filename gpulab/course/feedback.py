"""HTML feedback for every student, with the hidden tests kept hidden.

nbgrader's ``generate_feedback`` renders the autograded notebook, where autograde has put the
hidden tests back, and what the kernel printed (IPython's ``In`` history, encoded) can quote them;
so can an error the kernel reported, which the grader's verdict message repeats. Hence:

1. :class:`HideHiddenTests` (in ``c.GenerateFeedback.preprocessors``, so formgrader's button uses
   it too) cuts each hidden region with nbgrader's ``ClearHiddenTests``, keeps in a test cell only
   the grader's own outputs and the error's message, and replaces every output that shows a line
   of the instructor's notebook, also once decoded (base64, hex, zlib, rot13, string reprs:
   :func:`shows`), with :data:`REDACTED`. A line the student handed in is never a secret on their
   own page.
2. :func:`feedback` reads every page it wrote the same way and withholds one that still shows a
   hidden line (:data:`WITHHELD`).
3. A notebook nbgrader cannot render gets a page with a note; so does a submission that could not
   be graded at all (the note from ``grades.csv``).
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
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import ClearHiddenTests
from traitlets import Bool

from gpulab.autograde.box import integrity
from gpulab.autograde.box.links import read_regular
from gpulab.autograde.nbgrader import find_labs, nbgrader
from gpulab.autograde.students import alias, from_csv

BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"


REDACTED = "[removed: this output quoted the instructor's notebook]"


def _ws(line: str) -> str:
    return re.sub(r"\s+", " ", line).strip()


def _marked(source: str, begins: tuple[str, ...], ends: tuple[str, ...]) -> list[tuple[bool, str]]:
    """(inside a marked region, the line whitespace-collapsed) for each line between the markers."""
    out, inside = [], False
    for line in source.splitlines():
        if any(b in line for b in begins):
            inside = True
        elif any(e in line for e in ends):
            inside = False
        else:
            out.append((inside, _ws(line)))
    return out


def secret_lines(specs: dict[str, integrity.NotebookSpec], source_dir: Path | None = None,
                 min_chars: int = 12) -> set[str]:
    """Lines only the instructor's notebook holds: hidden tests (gradebook) and solutions (``source_dir``)."""
    lines = hidden_lines(specs, min_chars) | {BEGIN, END, "BEGIN SOLUTION", "END SOLUTION"}
    visible = {_ws(ln) for spec in specs.values() for cell in spec.cells
               for ln in integrity.release_source(cell.source).splitlines()}
    for name in specs:
        path = source_dir / f"{name}.ipynb" if source_dir else None
        if path is not None and path.is_file():
            for cell in nbformat.read(str(path), as_version=4).cells:
                lines |= {ln for inside, ln in _marked(cell.source, ("BEGIN SOLUTION", BEGIN), ("END SOLUTION", END))
                          if inside and len(ln) >= min_chars and ln not in visible}
    return lines


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DECOR = " \t'\"`,;()[]{}<>|#>:.\\"  # what a print, a repr or a prompt puts around a line
_B64 = re.compile(r"[A-Za-z0-9+/_-]{24,}={0,2}")
_HEX = re.compile(r"\b(?:[0-9a-fA-F]{2}){16,}\b")


def norm(line: str) -> str:
    """A line as it is compared: no colour codes, decoration stripped, whitespace collapsed."""
    return re.sub(r"\s+", " ", _ANSI.sub("", line)).strip(_DECOR)


def _decodings(text: str, depth: int = 0) -> list[str]:
    """``text``, unescaped, rot13'd, and what its base64, hex and zlib runs decode to (twice over)."""
    import base64
    import binascii
    import codecs
    import zlib

    def unescaped(t: str) -> list[str]:
        if "\\n" not in t and "\\'" not in t:
            return [t]
        return [t, t.replace("\\n", "\n").replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")]

    out = unescaped(text) + unescaped(codecs.encode(text, "rot13"))
    if depth >= 2:
        return out
    blobs = []
    for run in _B64.findall(text)[:200]:
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                blobs.append(decode(run + "=" * (-len(run) % 4)))
                break
            except (binascii.Error, ValueError):
                continue
    for run in _HEX.findall(text)[:200]:
        blobs.append(bytes.fromhex(run))
    for blob in blobs:
        for data in (blob, _inflate(blob, zlib)):
            if data:
                out += _decodings(data.decode("utf-8", "replace"), depth + 1)
    return out


def _inflate(blob: bytes, zlib) -> bytes | None:  # the module
    try:
        return zlib.decompressobj().decompress(blob, 1 << 24)
    except zlib.error:
        return None


def shows(text: str, secrets: set[str], own: set[str] = frozenset()) -> list[str]:
    """The lines of ``secrets`` that ``text`` shows as a whole line, also decoded (both :func:`norm`-ed);
    lines in ``own`` (what the student handed in) do not count."""
    if not secrets or not text:
        return []
    mine = {norm(s) for s in own}
    wanted = {norm(s): s for s in secrets if norm(s) and norm(s) not in mine}
    found = set()
    for variant in _decodings(text[: 8 * 2**20]):
        for line in variant.splitlines():
            n = norm(line)
            if n in wanted:
                found.add(wanted[n])
    return sorted(found)


def redact(text: str, lines: set[str], own: set[str] = frozenset()) -> str:
    """``text``, or :data:`REDACTED` when it shows one of ``lines`` (:func:`shows`)."""
    return REDACTED + "\n" if shows(text, lines, own) else text


class HideHiddenTests(ClearHiddenTests):
    """Feedback preprocessor: see the module doc (layer 1)."""

    enforce_metadata = Bool(False, help="feedback never fails on a cell that is not a grade cell").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: Any) -> tuple[NotebookNode, Any]:
        from gpulab.autograde.gradebook import db_url

        info = (resources or {}).get("nbgrader", {})
        self._secrets: set[str] = set()
        self._own: set[str] = set()
        lab = info.get("assignment")
        if lab:
            url = info.get("db_url") or db_url(Path.cwd())
            try:
                specs = integrity.lab_spec(url, lab)
            except Exception:  # no gradebook entry: the hidden regions are still cut below
                specs = {}
            self._secrets = secret_lines(specs, Path.cwd() / "source" / lab)
            student = info.get("student")
            if student:
                self._own = submitted_lines(submitted_folder(Path.cwd(), student, lab))
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
        secrets, own = getattr(self, "_secrets", set()), getattr(self, "_own", set())
        kept = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if test and kind != "error" and not out.get("metadata", {}).get("gpulab"):
                continue  # what the student's code showed while the tests ran; the grader's own outputs stay
            if kind == "error":
                out["evalue"] = redact(str(out.get("evalue", "")), secrets, own)
                if test:
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out['evalue']}",
                                        "(the traceback is not shown: this is a test cell)"]
                else:
                    out["traceback"] = [redact(str(t), secrets, own) for t in out.get("traceback", [])]
            elif kind == "stream":
                out["text"] = redact(str(out.get("text", "")), secrets, own)
            elif kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                for mime in list(data):
                    value = data[mime] if isinstance(data[mime], str) else "".join(map(str, data[mime])) \
                        if isinstance(data[mime], list) else str(data[mime])
                    if shows(value, secrets, own):  # any type: an image's base64 too
                        out["data"] = {"text/plain": REDACTED}
                        break
            kept.append(out)
        cell.outputs = kept
        return cell, resources


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
            for inside, ln in _marked(cell.source, (BEGIN,), (END,)):
                if ln:
                    (hidden if inside else visible).add(ln)
    return {ln for ln in hidden - visible if len(ln) >= min_chars}


def leaks(page: str, lines: set[str], own: set[str] = frozenset()) -> list[str]:
    """The hidden lines that ``page`` (HTML) shows, line by line and decoded (:func:`shows`)."""
    return shows(html_text(page, lines=True), lines, own)


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
            _page(course, student, lab, notebooks,
                  f"<h1>{html.escape(lab)}: {html.escape(row['score'])} / {html.escape(row['max_score'])}</h1>"
                  f"<p>Your submission could not be graded: {html.escape(row['notes'])}</p>")
            written += 1
    return written


WITHHELD = ("<!DOCTYPE html><html><body><h1>{lab}</h1><p>This feedback page was withheld: it showed part of "
            "the course's hidden tests. Ask your instructor for your feedback.</p></body></html>\n")


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
    """``nbgrader generate_feedback`` for each lab, then a leak check of every page: {lab: {"pages": n,
    "notes": n, "leaks": {html_path: [hidden lines]}, "failed": {student: why}, "error": str | None}}."""
    from gpulab.autograde.gradebook import db_url

    course = Path(course).resolve()
    labs = [lab] if lab else find_labs(course)
    report: dict[str, dict[str, Any]] = {}
    for name in labs:
        entry: dict[str, Any] = {"pages": 0, "notes": 0, "leaks": {}, "failed": {}, "error": None}
        report[name] = entry
        students = sorted(p.parent.name for p in (course / "autograded").glob(f"*/{name}") if p.is_dir()) \
            if (course / "autograded").is_dir() else []
        if not students:
            entry["error"] = "nothing autograded yet: run `make grade` first"
            continue
        specs = integrity.lab_spec(db_url(course), name)
        bad = {}
        for student in students:
            for nb in sorted((course / "autograded" / student / name).glob("*.ipynb")):
                why = readable(nb)
                if why:
                    bad[student] = f"{nb.name} is {why}"
        if not bad and _render(course, name, None) is None:
            pass
        else:  # one page at a time: one notebook nbgrader cannot render must not cost the class its pages
            for student in students:
                why = bad.get(student) or _render(course, name, student)
                if why:
                    entry["failed"][student] = why
                    _page(course, student, name, sorted(specs), f"<h1>{html.escape(name)}</h1><p>Your graded "
                          f"notebook could not be shown here: {html.escape(why)}.</p>")
        lines = hidden_lines(specs)  # (solutions are no secret on the page: a student's own code may match them)
        for page in sorted(course.glob(f"feedback/*/{name}/*.html")):
            own = submitted_lines(submitted_folder(course, page.parent.parent.name, name))
            found = leaks(page.read_text(errors="replace"), lines, own)
            if found:
                page.write_text(WITHHELD.format(lab=html.escape(name)))  # never released as it was
                entry["leaks"][str(page)] = found
            else:
                entry["pages"] += 1
        entry["notes"] = _note_pages(course, name, sorted(specs))
    return report
