"""The cells a translation covers, and the gettext catalogue that holds it (read and written with
Babel, which JupyterLab already brings).

One entry per non-empty markdown cell: ``msgctxt`` is the cell's id, ``msgid`` its English text,
``msgstr`` the translation. A written answer's cell holds the model answer (the rubric) in the
source notebook, so it is translated too; the release replaces it with nbgrader's stub either way.
"""

from __future__ import annotations

import importlib.metadata
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import nbformat
from babel.messages.catalog import Catalog
from babel.messages.pofile import denormalize, normalize, read_po, unescape, write_po

FUZZY = "fuzzy"
HEADER = ("# gpulab, lab {lab}: its {lang} translation, one entry per markdown cell (msgctxt: the cell's id).\n"
          "# make i18n-update LANG={lang} merges the English source in; make i18n-check checks it.")


@dataclass(frozen=True)
class Cell:
    id: str
    text: str
    note: str  # what kind of cell, shown to the translator as an extracted comment
    flags: frozenset[str] = frozenset()  # templates.FLAG for a text with {0}-style values


def cells(nb_path: Path) -> list[Cell]:
    """The translatable cells of a source notebook, in order."""
    nb = nbformat.read(str(nb_path), as_version=4)
    out = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "markdown" or not c.source.strip():
            continue
        if "id" not in c:
            raise ValueError(f"{nb_path}: markdown cell {i} has no id (nbformat 4.5 gives every cell one): "
                             "open and save the notebook with a current Jupyter, or run tools/nbauthor.py strip")
        meta = c.metadata.get("nbgrader", {})
        note = "written answer (the model answer: the rubric)" if meta.get("solution") else f"markdown, cell {i}"
        out.append(Cell(c.id, c.source, note))
    return out


def _version() -> str:
    try:
        return importlib.metadata.version("gpulab")
    except importlib.metadata.PackageNotFoundError:
        return "source"


def catalogue_path(course: Path, lang: str, lab: str) -> Path:
    return course / "i18n" / lang / f"{lab}.po"


def read(path: Path, lang: str) -> Catalog:
    data = path.read_bytes()  # read once: Babel parses it, _previous_ids finds what Babel skips
    try:
        cat = read_po(io.BytesIO(data), locale=lang, abort_invalid=True)
    except Exception as err:  # Babel raises PoFileError and others on a corrupt file
        raise ValueError(f"{path}: not a readable gettext catalogue ({err}); restore it from git "
                         "(`git checkout -- <file>`) and run make i18n-update again") from err
    previous = _previous_ids(data.decode("utf-8", errors="replace"))
    for m in cat:
        # Babel keeps a "#| msgid" line as a translator's comment ("# | msgid"); it is the old English
        # of a fuzzy entry, written again by write() while the entry is fuzzy, so it is dropped here
        m.user_comments = [c for c in m.user_comments if not c.startswith("| ")]
        if m.context in previous:
            m.previous_id = (previous[m.context],)
    return cat


def _previous_ids(text: str) -> dict[str, str]:
    """``{msgctxt: the old English}`` from the ``#| msgid`` lines, which Babel writes but does not read."""
    found = {}
    for block in text.split("\n\n"):
        lines = block.splitlines()
        old = [line[3:] for line in lines if line.startswith("#| ")]
        ctx = [line for line in lines if line.startswith("msgctxt ")]
        if old and ctx and old[0].startswith("msgid "):
            found[unescape(ctx[0][len("msgctxt "):])] = denormalize("\n".join([old[0][len("msgid "):], *old[1:]]))
    return found


def write(path: Path, catalog: Catalog) -> None:
    buf = io.BytesIO()
    # Babel rewraps "#| msgid" comments to 76 columns and loses spaces where it breaks them, so the
    # old English of a fuzzy entry is written here, one line of the string per comment line, as
    # gettext's msgmerge writes it
    write_po(buf, catalog, width=0, omit_header=False, include_previous=False, sort_output=False)
    text = buf.getvalue().decode("utf-8")
    for m in catalog:
        if m.id and m.context and FUZZY in m.flags and m.previous_id:
            ctx = f'\nmsgctxt {normalize(m.context, width=0)}\n'
            old = "\n".join(f"#| {line}" for line in f"msgid {normalize(m.previous_id[0], width=0)}".splitlines())
            text = text.replace(ctx, f"\n{old}{ctx}", 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".po.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # a crash mid-write leaves the old catalogue, never half of one


def entries(catalog: Catalog) -> dict[str, object]:
    """The catalogue's messages by context (cell id), header and obsolete entries left out."""
    return {m.context: m for m in catalog if m.id and m.context}


@dataclass
class Changes:
    added: list[str] = field(default_factory=list)    # new cells: empty entries to translate
    changed: list[str] = field(default_factory=list)  # English changed: flagged fuzzy
    removed: list[str] = field(default_factory=list)  # cells gone: entries dropped

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


def update(nb_path: Path, po_path: Path, lang: str, project: str = "gpulab",
           items: Callable[[Path], list[Cell]] | None = None) -> Changes:
    """Merge the notebook's cells (or what ``items`` reads from it) into ``po_path``, created if
    missing; return what changed."""
    before = read(po_path, lang) if po_path.exists() else None
    old = entries(before) if before is not None else {}
    new = Catalog(locale=lang, domain=nb_path.stem, project=project, version=_version(), fuzzy=False,
                  header_comment=HEADER.format(lab=nb_path.stem, lang=lang),
                  copyright_holder="the gpulab authors", msgid_bugs_address="the course's issue tracker",
                  language_team=f"gpulab {lang}", last_translator="the gpulab authors",
                  creation_date=before.creation_date if before is not None else None,
                  revision_date=before.revision_date if before is not None else None)
    changes = Changes()
    seen = set()
    for cell in (items or cells)(nb_path):
        seen.add(cell.id)
        prev = old.get(cell.id)
        if prev is None:
            new.add(cell.text, "", context=cell.id, auto_comments=[cell.note], flags=set(cell.flags))
            changes.added.append(cell.id)
        elif prev.id == cell.text:
            new.add(cell.text, prev.string, context=cell.id, auto_comments=[cell.note], flags=set(prev.flags) | cell.flags,
                    previous_id=prev.previous_id if FUZZY in prev.flags else ())
        else:  # the English changed: keep the translation to revise, with the English it translated
            was = (prev.previous_id or (prev.id,)) if FUZZY in prev.flags else (prev.id,)
            new.add(cell.text, prev.string, context=cell.id, auto_comments=[cell.note],
                    flags=set(prev.flags) | cell.flags | {FUZZY}, previous_id=was)
            changes.changed.append(cell.id)
    changes.removed = [cid for cid in old if cid not in seen]
    write(po_path, new)
    return changes
