"""gpulab.course.feedback: hidden tests leave no trace (code or traceback) in the feedback HTML."""

from __future__ import annotations

import os

import nbformat

from gpulab.course import feedback as fb


def test_hide_hidden_tests_removes_the_code_and_its_traceback() -> None:
    from nbconvert import HTMLExporter

    cell = nbformat.v4.new_code_cell("check(f(1) == 1)\n### BEGIN HIDDEN TESTS\nsecret_case_value = f(12345)\n"
                                     "### END HIDDEN TESTS", outputs=[nbformat.v4.new_output(
                                         "error", ename="GradingError", evalue="f(12345): expected 1",
                                         traceback=["line 3: secret_case_value = f(12345)"])])
    nb = nbformat.v4.new_notebook(cells=[cell])
    lines = {"secret_case_value = f(12345)"}
    raw, _ = HTMLExporter().from_notebook_node(nb)
    assert fb.leaks(raw, lines) == sorted(lines)  # the leak check sees code split by syntax highlighting
    fb.HideHiddenTests().preprocess_cell(cell, {}, 0)
    assert cell.source == "check(f(1) == 1)"
    assert cell.outputs[0].traceback[0] == "GradingError: f(12345): expected 1"
    clean, _ = HTMLExporter().from_notebook_node(nb)
    assert fb.leaks(clean, lines) == []


def test_a_hidden_line_the_student_wrote_is_no_leak_on_their_page(tmp_path) -> None:
    """A student who writes `from gpulab.grading import lab00` in a cell of their own knew that line: their
    page keeps it. A hidden line they never handed in still counts (the leaker's case). Only regular
    files are read: a FIFO or a link planted as a notebook is skipped."""
    own = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("from gpulab.grading import lab00\nx  =  1")])
    nbformat.write(own, str(tmp_path / "lab.ipynb"))
    (tmp_path / "broken.ipynb").write_text("{ not json")  # skipped, not fatal
    os.mkfifo(tmp_path / "fifo.ipynb")  # a planted FIFO would block a plain open() for ever
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "lab.ipynb")  # and a link is never followed
    mine = fb.submitted_lines(tmp_path)
    assert "from gpulab.grading import lab00" in mine and "x = 1" in mine
    hidden = {"from gpulab.grading import lab00", "secret_case_value = f(12345)"}
    page = "<pre>from gpulab.grading import lab00</pre><pre>secret_case_value = f(12345)</pre>"
    assert fb.leaks(page, hidden - mine) == ["secret_case_value = f(12345)"]
    assert fb.submitted_lines(tmp_path / "nobody") == set()
