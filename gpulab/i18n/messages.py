"""The graders' messages in the student's language: the ``what=`` and ``hint=`` texts of the test
cells' checks, from a second catalogue per lab, ``notebooks/i18n/<lang>/<lab>.checks.po``.

Extraction reads each code cell with ``ast``: every plain string given as ``what=`` or ``hint=``
(or as ``check(condition, what, hint)``'s second and third argument). An f-string is left in
English (its values are only known when it runs). At run time :func:`localize` swaps a check's
texts for their translations: in the student's kernel when ``GPULAB_LANG`` is set (``make lab
LANG=ko`` sets it), and in the grader from the submission's ``metadata.gpulab.lang``. What the
grader measured (values, shapes, differences) stays as it is.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path
from typing import Any

from gpulab.i18n import LANGUAGES

CATALOGUES = Path(__file__).resolve().parents[2] / "notebooks" / "i18n"
SUFFIX = ".checks"


def _catalog():  # Babel and nbformat load only where catalogues are read, not in every kernel
    from gpulab.i18n import catalog

    return catalog


def _texts(tree: ast.AST) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        args = [kw.value for kw in node.keywords if kw.arg in ("what", "hint")]
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        if name == "check":
            args += node.args[1:3]
        found += [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.strip()]
    return list(dict.fromkeys(found))


def cells(nb_path: Path) -> list[Any]:
    """One ``catalog.Cell`` per distinct check text of each code cell, keyed ``<cell id>:<n>``."""
    import nbformat

    catalog = _catalog()
    nb = nbformat.read(str(nb_path), as_version=4)
    out = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        code = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in c.source.splitlines())
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        out += [catalog.Cell(f"{c.id}:{n}", text, f"a check's what= or hint=, cell {i}")
                for n, text in enumerate(_texts(tree))]
    return out


def checks_path(course: Path, lang: str, lab: str) -> Path:
    return course / "i18n" / lang / f"{lab}{SUFFIX}.po"


@functools.cache
def table(lang: str) -> dict[str, str]:
    """English -> translation, from every current entry of the language's check catalogues."""
    catalog = _catalog()
    out: dict[str, str] = {}
    for po in sorted((CATALOGUES / lang).glob(f"*{SUFFIX}.po")):
        try:
            entries = catalog.entries(catalog.read(po, lang))
        except ValueError:
            continue  # a broken catalogue leaves its messages in English; make i18n-check names it
        out.update({m.id: m.string for m in entries.values() if m.string.strip() and catalog.FUZZY not in m.flags})
    return out


def localize(spec: dict[str, Any], lang: str | None) -> dict[str, Any]:
    """``spec`` with its ``what`` and ``hint`` translated where the catalogue has them."""
    if not lang or lang not in LANGUAGES:
        return spec
    words = table(lang)
    out = dict(spec, lang=lang)
    for key in ("what", "hint"):
        if spec.get(key) in words:
            out[key] = words[spec[key]]
    return out


def student_lang() -> str | None:
    """The student's language in their own kernel (``make lab LANG=ko`` sets ``GPULAB_LANG``)."""
    return os.environ.get("GPULAB_LANG") or None
