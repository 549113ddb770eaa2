"""gpulab.course.feedback_page: a page built from the submission, the release and the grader's verdicts;
nothing the graded kernel showed reaches it, however encoded (issue 48, item 4)."""

from __future__ import annotations

import base64
import os
import zlib

import nbformat
from nbconvert import HTMLExporter

from gpulab.course import feedback as fb
from gpulab.course import feedback_page as page

SECRET = "secret_case_value = f(12345)"
HIDDEN = f"check(f(1) == 1)\n### BEGIN HIDDEN TESTS\n{SECRET}\nassert_hidden_case(f, 99)\n### END HIDDEN TESTS"


def _cell(kind: str, source: str, gid: str | None = None, **flags: bool) -> nbformat.NotebookNode:
    make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
    cell = make(source)
    if gid:
        cell.metadata["nbgrader"] = {
            "grade_id": gid,
            "grade": flags.get("grade", False),
            "locked": True,
            "solution": flags.get("solution", False),
            "points": 2,
            "schema_version": 3,
        }
    return cell


def _release() -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(
        cells=[
            _cell("markdown", "# Lab"),
            _cell("code", "# YOUR CODE HERE", "f_impl", solution=True),
            _cell("code", "check(f(1) == 1)", "f_tests", grade=True),
            _cell("code", "check(g(1) == 1)", "g_tests", grade=True),
        ]
    )


def _history_leaks() -> tuple[str, str]:
    """What a student cell printed in the graded run: ``In`` with a one-character prefix per line, and
    as base85(zlib(...)) (the issue's two attacks; both passed the old decoding filters)."""
    history = ["", "def f(x): ...", HIDDEN]
    prefixed = "\n".join("|" + line for cell in history for line in cell.splitlines())
    return prefixed, base64.b85encode(zlib.compress(repr(history).encode())).decode()


def _graded(prefixed: str, packed: str) -> nbformat.NotebookNode:
    """The autograded notebook: hidden tests back, the graded run's outputs, the grader's verdicts."""
    nb = _release()
    nb.cells[1].source = "def f(x):\n    return x"
    nb.cells[2].source = HIDDEN
    nb.cells[2].outputs = [
        nbformat.v4.new_output(
            "error",
            ename="GradingError",
            evalue=f"f on the hidden cases: expected 1, got '{SECRET}'",
            traceback=["GradingError"],
        ),
        nbformat.v4.new_output("stream", name="stdout", text=prefixed),
        nbformat.v4.new_output("display_data", data={"text/plain": SECRET}, metadata={"gpulab": "verdict"}),
    ]
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text=packed)]  # passed: no verdict error
    nb.cells.append(_cell("code", "print(leak(In))"))
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=prefixed + "\n" + packed)]
    return nb


def _submitted() -> nbformat.NotebookNode:
    nb = _release()
    nb.cells[1].source = "def f(x):\n    return x  # my own answer"
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="my own run printed this\n")]
    nb.cells.append(_cell("code", "print(leak(In))"))
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="nothing hidden in my own run\n")]
    return nb


def _html(nb: nbformat.NotebookNode) -> str:
    return fb.html_text(HTMLExporter().from_notebook_node(nb)[0], lines=True)


def test_the_page_shows_the_submission_and_the_verdicts_never_the_graded_run() -> None:
    prefixed, packed = _history_leaks()
    graded = _graded(prefixed, packed)
    assert SECRET in _html(graded) and packed in _html(graded)  # the graded run shows both: the attack works there
    text = _html(page.build(_submitted(), _release(), graded))
    hidden = {"secret_case_value = f(12345)", "assert_hidden_case(f, 99)", "BEGIN HIDDEN TESTS"}
    assert not [ln for ln in hidden if ln in text], "a hidden-test line reached the page"
    assert packed not in text and "|check(f(1) == 1)" not in text, "an output of the graded run reached the page"
    assert (
        "return x  # my own answer" in text and "my own run printed this" in text
    )  # the student's cells, as handed in
    assert "nothing hidden in my own run" in text and "print(leak(In))" in text
    assert "check(f(1) == 1)" in text and "check(g(1) == 1)" in text  # the test cells' visible parts
    assert "failed: f on the hidden cases" in text and "expected 1" not in text  # the grader's words, not the kernel's
    assert page.PASSED in text


def test_verdict_words_keep_the_graders_part_only() -> None:
    assert page.verdict_words("triage: expected 'ok', got 'x'\n  Hint: read it", "GradingError") == "failed: triage"
    assert (
        page.verdict_words(f"every check passed, but the cell then raised ValueError: {SECRET}", "GradingError")
        == "failed: every check passed, but the cell then raised an error"
    )
    assert (
        page.verdict_words(f"the test stopped before checking g: {SECRET}", "GradingError")
        == "failed: the test stopped before checking g"
    )
    assert (
        page.verdict_words("not run: the kernel died in cell 4", "NotRunError") == "not run: the kernel died in cell 4"
    )
    assert page.verdict_words("", "GradingError") == "failed"


def test_deleted_test_cells_come_back_and_a_students_flags_make_no_grade_cell() -> None:
    submitted = _submitted()
    del submitted.cells[2]  # the student deleted f_tests
    forged = _cell("code", SECRET, "g_tests", grade=True)  # and pasted a cell claiming to be g_tests
    forged.metadata["nbgrader"]["points"] = 100
    submitted.cells.insert(3, forged)
    submitted.cells.insert(3, _cell("code", "x = 1", "mine", grade=True))
    graded = _graded(*_history_leaks())
    nb = page.build(submitted, _release(), graded)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    assert ids.index("f_tests") == ids.index("f_impl") + 1  # after the cell before it in the release
    assert ids.count("g_tests") == 1 and "mine" not in ids  # a flag of the student's own is dropped
    unread = page.build(None, _release(), graded, "lab.ipynb is not a notebook (ValueError)")
    assert [c.metadata.get("nbgrader", {}).get("grade_id") for c in unread.cells] == [None, "f_tests", "g_tests"]
    assert SECRET not in _html(unread) and "is not a notebook" in _html(unread)


def test_read_submitted_reads_regular_notebooks_only(tmp_path) -> None:
    nbformat.write(_submitted(), str(tmp_path / "lab.ipynb"))
    (tmp_path / "broken.ipynb").write_text("{ not json")
    os.mkfifo(tmp_path / "fifo.ipynb")  # a planted FIFO would block a plain open() for ever
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "lab.ipynb")  # and a link is never followed
    assert page.read_submitted(tmp_path / "lab.ipynb")[0] is not None
    for name in ("broken", "fifo", "link", "gone"):
        nb, why = page.read_submitted(tmp_path / f"{name}.ipynb")
        assert nb is None and why.startswith(f"{name}.ipynb"), why


def test_submitted_lines_are_the_students_own(tmp_path) -> None:
    """The tests count a hidden line the student wrote in their own submission as theirs (a student who
    writes `from gpulab.grading import lab00` knew it); only regular files are read."""
    own = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("from gpulab.grading import lab00\nx  =  1")])
    nbformat.write(own, str(tmp_path / "lab.ipynb"))
    (tmp_path / "broken.ipynb").write_text("{ not json")
    os.mkfifo(tmp_path / "fifo.ipynb")
    mine = fb.submitted_lines(tmp_path)
    assert "from gpulab.grading import lab00" in mine and "x = 1" in mine
    shown = "<pre>from gpulab.grading import lab00</pre><pre>secret_case_value = f(12345)</pre>"
    assert fb.leaks(shown, {"from gpulab.grading import lab00", SECRET}, mine) == [SECRET]
    assert fb.submitted_lines(tmp_path / "nobody") == set()
