"""Copies a human should look at: answer cells close to gpulab's reference, to the course's solution,
or to a classmate's, by winnowing (as MOSS does; the ``copydetect`` package).

Calling a masked reference fails, but pasting it (or the solution, or a classmate's answer) gives
correct evidence, which no verdict can tell. So after a lab is graded, every answer cell is
fingerprinted (names and comments filtered out, the release copy's scaffolding as boilerplate) and
compared with each reference of the lab, the same cell of the source notebook, and the same cell
of every classmate's submission. A pair long enough (:data:`MIN_OVERLAP`) and covering most of the
cell (:data:`THRESHOLD`) is noted in both rows. A note is not a verdict: short cells are written
alike by honest students, and code can be rewritten past any fingerprint.
"""

from __future__ import annotations

import inspect
import io
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable

import nbformat

from gpulab.accounts.students import shown

THRESHOLD = 0.8      # the share of the student's (filtered) cell found in the other
MIN_OVERLAP = 150    # characters of filtered code in common, at least: a rule of 3-4 statements (lab 00's backend and
                     # placement rules, 110-135) is written alike by honest students; a 9-line helper is about 200
NOISE, GUARANTEE = 25, 30  # copydetect's noise and guarantee thresholds (MOSS's k and window)


@dataclass(frozen=True)
class Match:
    """One answer cell found in another text."""

    cell: str
    other: str          # "gpulab's reference <name>", "the course's solution", "student <id>'s answer"
    share: float        # of the student's cell
    overlap: int        # filtered characters in common
    holds: float = 0.0  # of the reference or solution found in the student's cell

    def note(self) -> str:
        common = f"({self.overlap} characters of code in common after names are ignored)"
        if self.share < THRESHOLD <= self.holds:  # pasted whole, inside code of the student's own
            return f"cell {self.cell} holds {100 * self.holds:.0f}% of {self.other} {common}"
        return f"cell {self.cell} is {100 * self.share:.0f}% the same as {self.other} {common}"


def notes(matches: list[Match], named: int = 3) -> list[str]:
    """One note per match; a cell found in more than ``named`` classmates' answers gets one note."""
    out, classmates = [], {}
    for m in matches:
        if m.other.startswith("student "):
            classmates.setdefault(m.cell, []).append(m)
        else:
            out.append(m.note())
    for cell, found in classmates.items():
        if len(found) <= named:
            out += [m.note() for m in found]
            continue
        shares = {f"{100 * m.share:.0f}%" for m in found}
        share = shares.pop() if len(shares) == 1 else f"at least {100 * min(m.share for m in found):.0f}%"
        names = ", ".join(m.other.removeprefix("student ").removesuffix("'s answer") for m in found[:named])
        out.append(f"cell {cell} is {share} the same as the answers of {len(found)} classmates "
                   f"({names} and {len(found) - named} more)")
    return out


def answer_cells(nb: nbformat.NotebookNode) -> dict[str, str]:
    """``grade_id -> source`` of the code cells a student writes in."""
    out = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("solution") and meta.get("grade_id"):
            out[meta["grade_id"]] = cell.get("source", "")
    return out


def _fingerprint(name: str, text: str, boilerplate: Any = None) -> Any:
    from copydetect import CodeFingerprint

    return CodeFingerprint(f"{name}.py", NOISE, GUARANTEE - NOISE + 1, boilerplate=boilerplate, language="python",
                           fp=io.StringIO(text))


def _compare(a: Any, b: Any) -> tuple[int, float, float]:
    from copydetect import compare_files

    overlap, (share_a, share_b), _ = compare_files(a, b)
    return int(overlap), float(share_a), float(share_b)


def _boilerplate(release: dict[str, str], cell: str) -> Any:
    text = release.get(cell, "")
    if not text.strip():
        return None
    import numpy as np

    return np.array(sorted(_fingerprint("release", text).hashes), dtype=np.int64)


def reference_sources(references: Iterable[Any]) -> dict[str, str]:
    """``"gpulab's reference <dotted name>" -> source`` of each reference that has one."""
    out = {}
    for ref in references:
        obj = getattr(ref, "__func__", ref)
        try:
            out[f"gpulab's reference {obj.__module__}.{obj.__qualname__}"] = inspect.getsource(obj)
        except (OSError, TypeError):
            continue
    return out


def find_copies(submissions: dict[str, dict[str, str]], release: dict[str, str], solution: dict[str, str],
                references: dict[str, str]) -> dict[str, list[Match]]:
    """For each student (``submissions``: student -> :func:`answer_cells`), the answer cells found in a
    reference, the ``solution`` or a classmate's, the ``release`` copy's cells being boilerplate."""
    found: dict[str, list[Match]] = {s: [] for s in submissions}
    cells = sorted({c for cells in submissions.values() for c in cells})
    for cell in cells:
        boiler = _boilerplate(release, cell)
        prints = {s: _fingerprint(s, cells_[cell], boiler) for s, cells_ in submissions.items()
                  if cells_.get(cell, "").strip() and cells_[cell].strip() != release.get(cell, "").strip()}
        known = dict(references)
        if solution.get(cell, "").strip():
            known["the course's solution"] = solution[cell]
        known_prints = {name: _fingerprint("known", text, boiler) for name, text in known.items()}
        for student, fp in prints.items():
            for name, other in known_prints.items():
                # a reference or the solution pasted whole counts, however much code is around it
                overlap, share, holds = _compare(fp, other)
                if overlap >= MIN_OVERLAP and max(share, holds) >= THRESHOLD:
                    found[student].append(Match(cell, name, share, overlap, holds))
        for a, b in combinations(sorted(prints), 2):
            overlap, share_a, share_b = _compare(prints[a], prints[b])
            if overlap >= MIN_OVERLAP and min(share_a, share_b) >= THRESHOLD:
                found[a].append(Match(cell, f"student {shown(b)}'s answer", share_a, overlap))
                found[b].append(Match(cell, f"student {shown(a)}'s answer", share_b, overlap))
    return found


def lab_copies(course: Path, lab: str, students: list[str], references: Iterable[Any]) -> dict[str, list[Match]]:
    """:func:`find_copies` for one lab of the course: its submissions, release and source notebooks."""
    from gpulab.autograde.box.links import read_regular

    def cells_of(path: Path) -> dict[str, str]:
        try:
            return answer_cells(nbformat.reads(read_regular(path, 100 * 2**20).decode("utf-8"), as_version=4))
        except Exception:  # an unreadable notebook has no cells to compare (grading noted it)
            return {}

    source = course / "source" / lab
    out: dict[str, list[Match]] = {s: [] for s in students}
    for nb in sorted(source.glob("*.ipynb")):
        subs = {s: cells_of(course / "submitted" / s / lab / nb.name) for s in students}
        release = cells_of(course / "release" / lab / nb.name)
        for student, matches in find_copies(subs, release, cells_of(nb), reference_sources(references)).items():
            out[student] += matches
    return out
