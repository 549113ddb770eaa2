"""``make check`` takes nbgrader's verdict, not a word search (issue 16).

A passing notebook whose outputs and nbgrader warnings say ``ValueError`` is ok; a notebook with a
failing test cell, or an edited one, is FAIL with the cell named.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import nbauthor  # noqa: E402

from gpulab.course.release import check_work  # noqa: E402
from gpulab.course.validate import validate  # noqa: E402


def _lab(work: Path, test_src: str) -> Path:
    nb = work / "00_demo" / "00_demo.ipynb"
    nbauthor.write(nb, [
        # a plain cell whose output holds the word nbgrader's warnings hold on a correct notebook
        nbauthor.code("print('caught ValueError as expected: the error is the lesson')"),
        nbauthor.tests(test_src, "demo_test", points=1),
    ])
    return nb


def test_a_passing_notebook_that_prints_error_words_is_ok(tmp_path: Path, capsys) -> None:
    # the cell's value is an exception object: nbgrader warns with "ValueError(...)" but passes it
    nb = _lab(tmp_path, "'''passes.'''\nassert 1 + 1 == 2\nValueError('not an error, a value')")
    result = validate(nb)
    assert result.ok, result.summary()
    assert check_work(tmp_path) == 0
    assert "ok   " in capsys.readouterr().out


def test_a_failing_test_cell_is_fail_and_named(tmp_path: Path, capsys) -> None:
    nb = _lab(tmp_path, "'''fails on purpose.'''\nassert 1 + 1 == 3, 'arithmetic is broken'")
    result = validate(nb)
    assert not result.ok
    assert result.failed and result.failed[0][0].startswith("'''fails on purpose.'''")
    assert "AssertionError" in result.failed[0][1]
    assert check_work(tmp_path) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "arithmetic is broken" in out


def test_an_edited_test_cell_is_reported_as_changed(tmp_path: Path) -> None:
    nb = _lab(tmp_path, "'''passes.'''\nassert True")
    # a release copy carries checksums of its test cells; editing one is what nbgrader calls "changed"
    from nbgrader.utils import compute_checksum

    book = nbformat.read(str(nb), as_version=4)
    cell = book.cells[1]
    cell.metadata.nbgrader["checksum"] = compute_checksum(cell)
    cell.source = "'''passes.'''\nassert True  # edited by the student"
    nbformat.write(book, str(nb))
    result = validate(nb)
    assert not result.ok and result.changed, result
    assert "edited" in result.summary()


def test_no_result_is_an_error_not_a_pass(tmp_path: Path) -> None:
    bad = tmp_path / "00_demo" / "00_demo.ipynb"
    bad.parent.mkdir(parents=True)
    bad.write_text("{ not json")
    result = validate(bad)
    assert not result.ok and result.error
