"""A feedback notebook built from what the student handed in, never from what the graded kernel showed.

The autograded notebook holds the hidden tests again, and the graded kernel could read them while
they ran (IPython's ``In``, ``linecache``, the caller's frame, the kernel's current request): anything
it printed, displayed or raised may quote them, encoded any way it likes. So the page is built, by
:func:`build`, from three sources the kernel never wrote:

- the **submitted** notebook (``submitted/<student>/<lab>/``): the student's cells and the outputs of
  their own run, exactly as handed in (their kernel never had the hidden tests);
- for each test cell (by ``grade_id``), its **released** source: the visible part only, what the
  student was given (``release/<lab>/``, else the gradebook's source with the hidden regions cut);
- the **grader's verdict** on it: the score from the gradebook (nbgrader's ``GetGrades``, after this
  step) and, for a failed cell, the grader's words for what failed (:func:`verdict_words`). The
  grader's message also quotes what the student's code returned or raised while the hidden tests ran,
  and that part is the kernel's: it is not shown.

:class:`FromSubmission` is the first of ``c.GenerateFeedback.preprocessors`` (notebooks/nbgrader_config.py),
so ``make feedback`` and formgrader's button build the same page.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import nbformat
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from gpulab.autograde.box import integrity
from gpulab.autograde.box.links import read_regular
from gpulab.autograde.execute.outputs import NOT_RUN, VERDICT

PASSED = "passed: every check of this test cell held (graded by the grader, hidden tests included)"
FAILED = "failed"
NOT_SHOWN = (
    "(what your code returned or raised while the tests ran is not shown here: the hidden tests "
    "ran in that kernel; the visible checks above say the same when you run this cell yourself)"
)
NO_SUBMISSION = (
    "Your submitted notebook could not be read ({why}); below are the lab's test cells with the grader's verdicts."
)
NO_VERDICT = "no verdict was recorded for this test cell"


def verdict_words(message: str, ename: str) -> str:
    """The part of a failed test cell's message that is the grader's own, for the page.

    The grader's message is ``<what was checked>: <detail>`` (:func:`gpulab.verdict.check.fail`): the
    check's name comes from the course's source notebook, the detail quotes the student's values and
    errors. Only the text before the first ``": "`` is kept, and a cell-level message (``... the cell
    then raised <error>``) is cut before the error's name. A cell the grader did not run
    (``NotRunError``) says why in the grader's words only."""
    if ename == NOT_RUN:
        return message.splitlines()[0][:300] if message else FAILED
    words = message.split(": ", 1)[0].splitlines()[0] if message else ""
    if " raised " in f" {words} ":
        words = words.split(" raised", 1)[0] + " raised an error"
    return f"{FAILED}: {words[:300]}" if words else FAILED


def grader_verdicts(autograded: NotebookNode, tests: set[str]) -> dict[str, tuple[str, str]]:
    """``grade_id -> (ename, message)`` of each failed test cell, read from where only the grader
    writes: the first output of a test cell it failed (the kernel's own errors are dropped there,
    :func:`gpulab.autograde.execute.outputs.write_verdict`). A passed cell has none."""
    found: dict[str, tuple[str, str]] = {}
    for cell in autograded.get("cells", []):
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        outs = cell.get("outputs") or []
        if (
            gid in tests
            and gid not in found
            and outs
            and outs[0].get("output_type") == "error"
            and outs[0].get("ename") in (VERDICT, NOT_RUN)
        ):
            found[gid] = (str(outs[0].get("ename")), str(outs[0].get("evalue", "")))
    return found


def _verdict_output(failed: tuple[str, str] | None, known: bool) -> NotebookNode:
    if failed is None:
        text = PASSED if known else NO_VERDICT
        return nbformat.v4.new_output("stream", name="stdout", text=f"grader: {text}\n")
    ename, message = failed
    words = verdict_words(message, ename)
    extra = "" if ename == NOT_RUN else f"\n{NOT_SHOWN}"
    return nbformat.v4.new_output("error", ename=VERDICT, evalue=words, traceback=[f"grader: {words}{extra}"])


def _released(cell: NotebookNode) -> NotebookNode:
    """A cell of the release, outputs cleared (what the student was given)."""
    out = copy.deepcopy(cell)
    if out.cell_type == "code":
        out.outputs, out.execution_count = [], None
    return out


def build(
    submitted: NotebookNode | None, release: NotebookNode, autograded: NotebookNode, why_unread: str = ""
) -> NotebookNode:
    """The feedback notebook (see the module doc). ``submitted`` None: it could not be read
    (``why_unread``); the page then holds the release's test cells and their verdicts.

    ``release``'s cells carry the nbgrader metadata (``grade_id``, points) that ``GetGrades`` reads
    the gradebook's scores by; a submitted cell keeps its nbgrader metadata only when it names a cell
    of the release, as the release has it (a student's own flags never make a grade cell)."""
    by_id = {
        c.metadata["nbgrader"]["grade_id"]: c
        for c in release.cells
        if isinstance(c.get("metadata", {}).get("nbgrader", {}).get("grade_id"), str)
    }
    tests = {gid for gid, c in by_id.items() if is_test_cell(c)}
    failed = grader_verdicts(autograded, tests)
    graded = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in autograded.get("cells", [])}

    def test_cell(gid: str) -> NotebookNode:
        cell = _released(by_id[gid])
        cell.outputs = [_verdict_output(failed.get(gid), gid in graded)]
        return cell

    cells: list[NotebookNode] = []
    placed: set[str] = set()
    if submitted is None:
        cells.append(nbformat.v4.new_markdown_cell(NO_SUBMISSION.format(why=why_unread)))
        source_cells = [c for c in release.cells if c.metadata.get("nbgrader", {}).get("grade_id") in tests]
    else:
        source_cells = list(submitted.cells)
    for cell in source_cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in tests:
            if gid not in placed:  # a test cell the student copied is shown once
                cells.append(test_cell(gid))
                placed.add(gid)
            continue
        cell = copy.deepcopy(cell)
        cell.metadata.pop("nbgrader", None)
        if gid in by_id:
            cell.metadata["nbgrader"] = copy.deepcopy(by_id[gid].metadata["nbgrader"])
        cells.append(cell)
    # a test cell the student deleted was graded all the same: it goes after the cell before it in the release
    order = [c.metadata.get("nbgrader", {}).get("grade_id") for c in release.cells]
    for gid in [g for g in order if g in tests and g not in placed]:
        before = {g for g in order[: order.index(gid)] if g is not None}
        at = max(
            (i + 1 for i, c in enumerate(cells) if c.metadata.get("nbgrader", {}).get("grade_id") in before),
            default=len(cells),
        )
        cells.insert(at, test_cell(gid))
        placed.add(gid)
    nb = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(release.metadata))
    nb.nbformat_minor = 4  # no cell ids: a test cell's id and the student's may clash
    for cell in nb.cells:
        cell.pop("id", None)
    return nb


def is_test_cell(cell: NotebookNode) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def read_submitted(path: Path, max_bytes: int = 100 * 2**20) -> tuple[NotebookNode | None, str]:
    """The submitted notebook at ``path`` (a regular file only), or None and why it cannot be read."""
    data = read_regular(path, max_bytes)
    if data is None:
        return None, f"{path.name} is missing or not a regular file of at most {max_bytes >> 20} MiB"
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no cells")
        return nb, ""
    except RecursionError:
        return None, f"{path.name} is nested too deeply to read"
    except Exception as err:  # any reason is a reason
        return None, f"{path.name} is not a notebook ({type(err).__name__})"


def release_notebook(course: Path, lab: str, notebook: str, db_url: str) -> NotebookNode:
    """The notebook as released (``release/<lab>/<notebook>.ipynb``), or rebuilt from the gradebook's
    cells with the hidden regions cut when the release folder is gone."""
    path = course / "release" / lab / f"{notebook}.ipynb"
    if path.is_file():
        return nbformat.read(str(path), as_version=4)
    spec = integrity.lab_spec(db_url, lab, course / "source" / lab)[notebook]
    cells = []
    for c in spec.cells:
        make = nbformat.v4.new_code_cell if c.cell_type == "code" else nbformat.v4.new_markdown_cell
        source = "" if c.solution else integrity.release_source(c.source) if c.grade else c.source
        cells.append(make(source, metadata={"nbgrader": c.metadata()}))  # (a solution is never needed here)
    return nbformat.v4.new_notebook(cells=cells)


class FromSubmission(NbGraderPreprocessor):
    """``GenerateFeedback``'s first step: replaces the autograded notebook by :func:`build`'s."""

    def preprocess(self, nb: NotebookNode, resources: Any) -> tuple[NotebookNode, Any]:
        from nbgrader.coursedir import CourseDirectory

        from gpulab.course.feedback import submitted_folder

        info = resources["nbgrader"]
        course = Path(CourseDirectory(config=self.config).root).resolve()
        lab, student, name = info["assignment"], info["student"], info["notebook"]
        release = release_notebook(course, lab, name, info["db_url"])
        submitted, why = read_submitted(submitted_folder(course, student, lab) / f"{name}.ipynb")
        return build(submitted, release, nb, why), resources
