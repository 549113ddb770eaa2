"""The audit of issue 48: no graded kernel holds an expected value or a way to compute one.

Read from every source notebook's test cells (nothing is run). In the hidden part of a test,
which the student never sees:
- no check is given an expected value: ``check_equal``, ``check_close`` and ``check_shape`` name
  only the student's value (the reference run's solution gives the other side);
- nothing computes an expected value by other means (``by_reference`` is gone; no ``expected=``;
  no ``interactive_expected``, which a visible test may use: it yields nothing under the grader);
- no ``grading.check(condition)``: it sends nothing under the grader, so in a hidden test it is
  dead code that reads as a check.
In every test cell: at least one check that sends evidence (a cell with none would score its points
for nothing), and no timing of the kernel's own (``check_speedup``, ``check_ratio``: a ratio the
kernel computed is a verdict the kernel computed).
"""

from __future__ import annotations

import ast
import re

import nbformat
import pytest
from conftest import COURSE

LABS = sorted(p.parent.name for p in (COURSE / "source").glob("*/*.ipynb") if p.parent.name[:2].isdigit())
VALUE_CHECKS = {"check_equal", "check_close", "check_shape"}
EVIDENCE = VALUE_CHECKS | {"check_between", "check_rule", "check_raises", "catch", "check_measured"}
GONE = {"by_reference", "check_speedup", "check_ratio", "Lazy"}
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


def _test_cells(lab: str) -> list[tuple[str, str]]:
    nb = nbformat.read(str(COURSE / "source" / lab / f"{lab}.ipynb"), as_version=4)
    return [(c.metadata["nbgrader"]["grade_id"], c.source) for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")
            and not c.metadata["nbgrader"].get("solution")]


def _calls(code: str) -> list[ast.Call]:
    code = re.sub(r"^\s*[%!].*$", "", code, flags=re.M)
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)]


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def problems(grade_id: str, source: str) -> list[str]:
    """What in one test cell breaks the audit."""
    out = []
    hidden = "\n".join(HIDDEN.findall(source))
    for call in _calls(hidden) if hidden.strip() else []:
        name = _name(call)
        if name in VALUE_CHECKS and (len(call.args) > 1 or any(k.arg in ("expected", "shape") for k in call.keywords)):
            out.append(f"{grade_id}: a hidden {name} is given an expected value (line {call.lineno} of the hidden part)")
        if name == "interactive_expected":
            out.append(f"{grade_id}: a hidden interactive_expected: a hidden test names no expected value (line {call.lineno})")
        if name == "check" and isinstance(call.func, ast.Attribute):
            out.append(f"{grade_id}: a hidden grading.check(...) sends nothing under the grader (line {call.lineno})")
    names = {_name(c) for c in _calls(source)} | {n.id for n in ast.walk(ast.parse(re.sub(r"^\s*[%!].*$", "", source,
                                                                                           flags=re.M)))
                                                 if isinstance(n, ast.Name)}
    out += [f"{grade_id}: uses {n}, which computes a verdict or an expected value in the kernel" for n in GONE & names]
    if not EVIDENCE & {_name(c) for c in _calls(source)}:
        out.append(f"{grade_id}: no check that sends evidence: its points would be scored for nothing")
    return out


@pytest.mark.parametrize("lab", LABS)
def test_no_graded_kernel_holds_an_expected_value(lab: str) -> None:
    cells = _test_cells(lab)
    assert cells, f"{lab} has no test cells"
    found = [p for gid, src in cells for p in problems(gid, src)]
    assert found == [], "\n".join(found)


def test_the_audit_catches_each_kind() -> None:
    bad = '''grading.check_equal(f(1), 2, what="visible")
### BEGIN HIDDEN TESTS
grading.check_equal(f(x), g(x), what="hidden")
grading.check_close(f(x), expected=g(x), what="hidden")
grading.check(f(x) == 3, "hidden")
grading.check_equal(f(x), grading.by_reference(g, x), what="hidden")
grading.check_equal(f(x), grading.interactive_expected(g, x), what="hidden")
### END HIDDEN TESTS'''
    found = problems("bad", bad)
    assert len([p for p in found if "given an expected value" in p]) == 4, found
    assert any("hidden interactive_expected" in p for p in found), found
    assert any("sends nothing" in p for p in found) and any("by_reference" in p for p in found), found
    assert problems("none", 'grading.check(True, "x")') == ["none: no check that sends evidence: its points would "
                                                           "be scored for nothing"]
    good = 'grading.check_equal(f(1), 2, what="v")\n### BEGIN HIDDEN TESTS\ngrading.check_equal(f(x), what="h")\n### END HIDDEN TESTS'
    assert problems("good", good) == []
