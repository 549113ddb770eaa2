"""``make check`` takes nbgrader's verdict, not a word search (issue 16).

A passing notebook whose outputs and nbgrader warnings say ``ValueError`` is ok; a notebook with a
failing test cell, or an edited one, is FAIL with the cell named.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import nbauthor
from conftest import COURSE

from gpulab.course.release import check_work
from gpulab.course.validate import validate


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


def test_validate_names_the_cell_stopped_by_the_limit() -> None:
    """A failing test after a cell stopped by the time limit says which cell stopped, not only the
    NameError it led to."""
    import nbformat

    from gpulab.autograde.execute.preprocessor import GpulabExecute as ValidateExecute

    slow = nbformat.v4.new_code_cell("import time\ntime.sleep(30)\nanswer = 42")
    test = nbformat.v4.new_code_cell("assert answer == 42")
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t", "points": 1, "locked": True}
    nb = nbformat.v4.new_notebook(cells=[slow, test])
    ValidateExecute(timeout=3, interrupt_on_timeout=True).preprocess(nb, {})
    assert slow.outputs[-1].ename == "CellTimeoutError"
    err = [o for o in test.outputs if o.output_type == "error"][0]
    assert err.ename == "NameError" and "cell 0 above ran past the 3 s limit" in err.evalue


def test_the_course_and_the_students_lab_share_the_execution_limits(tmp_path) -> None:
    from traitlets.config.loader import PyFileConfigLoader

    from gpulab.autograde.execute.config import CELL_TIMEOUT_S
    from gpulab.course.lab import write_config

    student = write_config(tmp_path / "student", instructor=False)
    for folder in (student, COURSE):
        config = PyFileConfigLoader("nbgrader_config.py", path=str(folder)).load_config()
        assert config.Execute.timeout == CELL_TIMEOUT_S and config.Execute.interrupt_on_timeout, folder
