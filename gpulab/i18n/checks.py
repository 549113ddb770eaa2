"""What ``make i18n-check`` refuses, per catalogue: the translation must cover every cell of the
English source as it is now, and keep what must not change.

- **missing**: a cell with no entry, or an entry with no translation;
- **stale**: an entry flagged fuzzy (its English changed since it was translated), or whose English
  is not the cell's text any more (the notebook was edited after the last ``make i18n-update``);
- **orphaned**: an entry for a cell that is gone;
- **kept as is**: every code span (`` `x` ``), math span (``$x$``), link target and number of the
  English must appear in the translation, and the ``<details>`` folds must stay folds;
- **values**: a template (an f-string, a printed line) keeps each of its ``{0}``-style values;
- **glossary**: a term of ``docs/i18n/<lang>-glossary.md`` is translated as the glossary says,
  wherever its English appears.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpulab.i18n import catalog, templates

CODE = re.compile(r"(`+)(.+?)\1", re.S)
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)|(https?://[^\s)>\]*]+)")  # a bare address ends before markdown's **
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")  # in the English: a number of its own, not H100's
ANY_NUMBER = re.compile(r"(?<![\d.,])\d+(?:[.,]\d+)*")  # in a translation: also glued to a Korean word (2배)
TAGS = ("<details>", "</details>", "<summary>", "</summary>")


@dataclass(frozen=True)
class Problem:
    lab: str
    cell: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.lab} cell {self.cell}: {self.kind}: {self.detail}"


def _protected(text: str) -> tuple[list[str], str]:
    """(code and math spans, the text without them)."""
    spans = [m.group(0) for m in CODE.finditer(text)]
    rest = CODE.sub(" ", text)
    spans += MATH.findall(rest)
    return spans, MATH.sub(" ", rest)


def kept(english: str, translated: str) -> list[str]:
    """What the translation lost of what must stay as it is."""
    lost = []
    spans, prose = _protected(english)
    t_spans, t_prose = _protected(translated)
    for span in sorted(set(spans)):
        if span not in t_spans:
            lost.append(f"the code/math span {span[:60]!r}")
    targets = {a or b for a, b in LINK.findall(english)}
    for target in sorted(targets):
        if target not in translated:
            lost.append(f"the link {target[:80]!r}")
    have = Counter(ANY_NUMBER.findall(t_prose))
    for number, n in sorted(Counter(NUMBER.findall(prose)).items()):
        if have[number] < 1:
            lost.append(f"the number {number}")
    for tag in TAGS:
        if english.count(tag) != translated.count(tag):
            lost.append(f"{tag} ({english.count(tag)} in the English, {translated.count(tag)} here)")
    return lost


def glossary(path: Path) -> dict[str, str]:
    """``{english term: translation}`` from the glossary's table rows (``| term | translation | ... |``)."""
    terms = {}
    if not path.exists():
        return terms
    for line in path.read_text(encoding="utf-8").splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) >= 2 and line.lstrip().startswith("|") and cols[0] and not set(cols[0]) <= set("-: "):
            if cols[0].lower() in ("english", "영어"):
                continue
            terms[cols[0].strip("*")] = cols[1].strip("*")
    return terms


def _loose(term: str) -> str:
    """The term as a pattern in which a space and a hyphen match each other (mixed-precision)."""
    return r"[-\s]".join(re.escape(word) for word in re.split(r"[-\s]+", term))


def term_misses(english: str, translated: str, terms: dict[str, str]) -> list[str]:
    _, prose = _protected(english)
    misses = []
    for term, ko in terms.items():
        if re.search(rf"(?<![\w.-]){_loose(term)}(?:s|es)?(?![\w(\[=-])", prose, re.I) and ko.lower() not in translated.lower():
            misses.append(f"{term!r} must be translated as {ko!r} (docs/i18n glossary)")
    return misses


def check_lab(nb_path: Path, po_path: Path, lang: str, terms: dict[str, str],
              items: Callable[[Path], list[catalog.Cell]] = catalog.cells) -> list[Problem]:
    lab = po_path.name.removesuffix(".po")
    source = {c.id: c for c in items(nb_path)}
    have = catalog.entries(catalog.read(po_path, lang))
    problems = []
    for cid, cell in source.items():
        m = have.get(cid)
        if m is None:
            problems.append(Problem(lab, cid, "missing", "no entry: run make i18n-update, then translate it"))
            continue
        if catalog.FUZZY in m.flags:
            problems.append(Problem(lab, cid, "stale", "the English changed since it was translated (fuzzy): "
                                    "revise the translation, then remove the fuzzy flag"))
        elif m.id != cell.text:
            problems.append(Problem(lab, cid, "stale", "the notebook changed after the last make i18n-update: run it"))
        if not m.string.strip():
            problems.append(Problem(lab, cid, "missing", "not translated yet"))
            continue
        problems += [Problem(lab, cid, "kept as is", f"the translation lost {x}") for x in kept(cell.text, m.string)]
        if templates.FLAG in cell.flags:
            problems += [Problem(lab, cid, "values", x) for x in templates.problems(cell.text, m.string)]
        problems += [Problem(lab, cid, "glossary", x) for x in term_misses(cell.text, m.string, terms)]
    problems += [Problem(lab, cid, "orphaned", "its cell is gone from the notebook: run make i18n-update")
                 for cid in have if cid not in source]
    return problems
