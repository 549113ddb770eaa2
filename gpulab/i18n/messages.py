"""The graders' messages in the student's language: the ``what=`` and ``hint=`` texts of the test
cells' checks, from a second catalogue per lab, ``notebooks/i18n/<lang>/<lab>.checks.po``.

Extraction reads each code cell with ``ast``: every plain string given as ``what=`` or ``hint=``
(or as ``check(condition, what, hint)``'s second and third argument). An f-string becomes a
template (:mod:`gpulab.i18n.templates`): its values are filled in from the English text as it
came out. At run time :func:`localize` swaps a check's texts for their translations: in the
student's kernel when ``GPULAB_LANG`` is set (``make lab LANG=ko`` sets it), and in the grader from
the submission's ``metadata.gpulab.lang``. The judge's own words around them come from the kit's
catalogue, ``gpulab.judge.po`` (:func:`say`), which is the table
:data:`gpulab.i18n.verdict_texts.TEXTS` (:func:`judge_cells`). What the grader measured (values, shapes,
differences) stays as it is.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path
from typing import Any

from gpulab.i18n import LANGUAGES, templates, verdict_texts

CATALOGUES = Path(__file__).resolve().parents[2] / "notebooks" / "i18n"
SUFFIX = ".checks"


def _catalog():  # Babel and nbformat load only where catalogues are read, not in every kernel
    from gpulab.i18n import catalog

    return catalog


def _check_args(tree: ast.AST) -> list[ast.expr]:
    """Every ``what=``/``hint=`` argument (and ``check(condition, what, hint)``'s second and third)."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        found += [kw.value for kw in node.keywords if kw.arg in ("what", "hint")]
        if getattr(node.func, "attr", getattr(node.func, "id", "")) == "check":
            found += node.args[1:3]
    return found


def _texts(tree: ast.AST) -> list[str]:
    """The plain strings, each once."""
    return list(dict.fromkeys(a.value for a in _check_args(tree)
                              if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.strip()))


def _templates(tree: ast.AST) -> dict[str, list[str]]:
    """The f-strings, as templates (``{template: the source of each value}``), each once."""
    found: dict[str, list[str]] = {}
    for a in _check_args(tree):
        made = templates.from_parts([a]) if isinstance(a, (ast.JoinedStr, ast.BinOp)) and templates.texty(a) else None
        if made:
            found.setdefault(*made)
    return found


def parse_cell(source: str) -> ast.AST | None:
    """A code cell's tree, its IPython magics and shell lines read as ``pass``; None if it does not parse."""
    code = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def values_note(values: list[str]) -> str:
    """What each ``{n}`` of a template stands for, for the translator (empty if it has none)."""
    return (", with values: " + "; ".join(f"{{{i}}} = {v}" for i, v in enumerate(values))) if values else ""


def cells(nb_path: Path) -> list[Any]:
    """One ``catalog.Cell`` per distinct check text of each code cell: a plain string keyed
    ``<cell id>:<n>``, an f-string's template ``<cell id>:f<n>`` (flagged as a template)."""
    import nbformat

    catalog = _catalog()
    nb = nbformat.read(str(nb_path), as_version=4)
    out = []
    for i, c in enumerate(nb.cells):
        tree = parse_cell(c.source) if c.cell_type == "code" else None
        if tree is None:
            continue
        out += [catalog.Cell(f"{c.id}:{n}", text, f"a check's what= or hint=, cell {i}")
                for n, text in enumerate(_texts(tree))]
        out += [catalog.Cell(f"{c.id}:f{n}", text, f"a check's what= or hint=, cell {i}" + values_note(values),
                             frozenset({templates.FLAG}))
                for n, (text, values) in enumerate(_templates(tree).items())]
    return out


# gpulab's own texts that a check's message is made of: the judge's verdicts ("expected {0}, got
# {1}"), the table gpulab.i18n.verdict_texts.TEXTS, one catalogue for the kit
# (``notebooks/i18n/<lang>/gpulab.judge.po``)
KIT = "gpulab"
JUDGE = Path(verdict_texts.__file__)  # the catalogue's source: the table
JUDGE_SUFFIX = ".judge"


def judge_cells(_source: Path = JUDGE) -> list[Any]:
    """The judge's verdict texts, one template per id of :data:`~gpulab.i18n.verdict_texts.TEXTS`,
    keyed by that id, in the table's order (``_source``: the table's file, as ``catalog.update``
    passes its source; the entries come from the imported table)."""
    catalog = _catalog()
    return [catalog.Cell(key, t.template, "a verdict of the judge" + values_note(list(t.values)),
                         frozenset({templates.FLAG}) if t.values else frozenset())
            for key, t in verdict_texts.TEXTS.items()]


def judge_path(course: Path, lang: str, lab: str = KIT) -> Path:
    return course / "i18n" / lang / f"{KIT}{JUDGE_SUFFIX}.po"


@functools.cache
def verdicts(lang: str) -> templates.Matcher:
    return matcher(lang, JUDGE_SUFFIX)


def say(detail: str, lang: str | None) -> str:
    """A verdict's detail (``expected 4, got 5``) in ``lang``, where the kit's catalogue has it."""
    if not lang or lang not in LANGUAGES:
        return detail
    return verdicts(lang).translate(detail, nested=True) or detail


def checks_path(course: Path, lang: str, lab: str) -> Path:
    return course / "i18n" / lang / f"{lab}{SUFFIX}.po"


def matcher(lang: str, suffix: str) -> templates.Matcher:
    """English -> translation, from every current entry of the language's ``*<suffix>.po``
    catalogues: plain texts looked up as they are, templates matched."""
    catalog = _catalog()
    exact: dict[str, str] = {}
    made: dict[str, str] = {}
    for po in sorted((CATALOGUES / lang).glob(f"*{suffix}.po")):
        try:
            entries = catalog.entries(catalog.read(po, lang))
        except ValueError:
            continue  # a broken catalogue leaves its messages in English; make i18n-check names it
        for m in entries.values():
            if m.string.strip() and catalog.FUZZY not in m.flags:
                (made if templates.FLAG in m.flags else exact)[m.id] = m.string
    return templates.Matcher(exact, made)


@functools.cache
def table(lang: str) -> templates.Matcher:
    return matcher(lang, SUFFIX)


def localize(spec: dict[str, Any], lang: str | None) -> dict[str, Any]:
    """``spec`` with its ``what`` and ``hint`` translated where the catalogue has them."""
    if not lang or lang not in LANGUAGES:
        return spec
    words = table(lang)
    out = dict(spec, lang=lang)
    for key in ("what", "hint"):
        text = spec.get(key)
        translated = words.translate(text) if isinstance(text, str) and text else None
        if translated is not None:
            out[key] = translated
    return out


def student_lang() -> str | None:
    """The student's language in their own kernel (``make lab LANG=ko`` sets ``GPULAB_LANG``)."""
    return os.environ.get("GPULAB_LANG") or None
