"""The translated course root: a copy of ``notebooks/`` whose source notebooks carry the
translation, for nbgrader's ``generate_assignment`` (``make release LANG=ko``) and ``make lab``.

Only markdown cells change, so every grade id, point, hidden test and checksum of a code cell is
the English one: a submission from either edition grades the same in the English course. A lab
without a catalogue stays English, with a first cell that says so.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from gpulab.i18n import LANGUAGES, catalog

SKIP = {".ipynb_checkpoints", "__pycache__", "traces"}


def translate(nb_path: Path, po_path: Path | None, lang: str) -> nbformat.NotebookNode:
    nb = nbformat.read(str(nb_path), as_version=4)
    nb.metadata.setdefault("gpulab", {})["lang"] = lang
    if po_path is None or not po_path.exists():
        note = nbformat.v4.new_markdown_cell(LANGUAGES[lang].untranslated, id="gpulab-untranslated")
        note.metadata["gpulab"] = {"untranslated": True}
        nb.cells.insert(0, note)
        return nb
    entries = catalog.entries(catalog.read(po_path, lang))
    for c in nb.cells:  # a translation replaces the cell it was made from, as that cell reads now
        m = entries.get(c.get("id")) if c.cell_type == "markdown" else None
        if m is not None and m.string.strip() and catalog.FUZZY not in m.flags and m.id == c.source:
            c.source = m.string
    return nb


def build(course: Path, lang: str, out: Path) -> list[str]:
    """Bring the ``lang`` course root in ``out`` up to date with ``course``; return the labs that have
    no catalogue yet. A file is written only when its content changed, so ``make lab`` releases again
    only the labs whose text changed; what nbgrader made in ``out`` (release/, the gradebook) stays."""
    if lang not in LANGUAGES:
        raise ValueError(f"no {lang!r} edition: the languages are {', '.join(LANGUAGES)}")
    source = course / "source"
    wanted: dict[Path, bytes] = {out / "nbgrader_config.py": (course / "nbgrader_config.py").read_bytes()}
    missing = []
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(course)
        if not path.is_file() or SKIP & set(rel.parts) or path.suffix == ".h5":
            continue
        if path.suffix == ".ipynb":
            po = catalog.catalogue_path(course, lang, path.stem)
            if not po.exists():
                missing.append(path.stem)
            wanted[out / rel] = nbformat.writes(translate(path, po, lang)).encode() + b"\n"
        else:
            wanted[out / rel] = path.read_bytes()
    for target, data in wanted.items():
        if not target.exists() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(target)
    for stale in sorted((out / "source").rglob("*"), reverse=True):  # files the English source no longer has
        if stale.is_file() and stale not in wanted and not SKIP & set(stale.relative_to(out).parts):
            stale.unlink()
    return missing
