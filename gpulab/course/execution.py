"""The course's execution limits, in one place, for every way a notebook is run: the Validate button,
``make check`` and ``make grade``. Each reads an ``nbgrader_config.py`` (the course's, or the one
``make lab`` writes for the student) that calls :func:`configure`, so a cell has the same
:data:`CELL_TIMEOUT_S` everywhere (nbgrader's default, 30 s, cut lab 10 short in Validate). A cell
stopped by the limit says so, and every test that fails after it names that cell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute

CELL_TIMEOUT_S = 300  # every lab runs in about 2 minutes on a 2-core laptop: a cell of 5 minutes is a loop
TIMEOUT = "CellTimeoutError"


def timeout_error(limit: int | None = CELL_TIMEOUT_S) -> dict[str, Any]:
    """The error a cell stopped by the limit shows (nbclient's ``error_on_timeout``)."""
    text = (f"this cell ran past the course's limit of {limit} s per cell and was interrupted; the cells after "
            "it ran without what it would have defined")
    return {"ename": TIMEOUT, "evalue": text, "traceback": [f"{TIMEOUT}: {text}"]}


def after_timeout(index: int, limit: int | None) -> str:
    """What a failing test adds when an earlier cell was stopped by the limit."""
    return f"(cell {index} above ran past the {limit} s limit per cell and was stopped: that may be why)"


class ValidateExecute(Execute):
    """nbgrader's ``Execute`` for Validate and ``make check``: after a cell stopped by the time limit,
    each failing test cell names it."""

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None) -> tuple[NotebookNode, Any]:
        self._timed_out: int | None = None
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int) -> tuple[NotebookNode, Any]:
        cell, resources = super().preprocess_cell(cell, resources, index)
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if any(o.get("ename") == TIMEOUT for o in errors):
            self._timed_out = index if self._timed_out is None else self._timed_out
        elif errors and self._timed_out is not None and cell.metadata.get("nbgrader", {}).get("grade"):
            note = after_timeout(self._timed_out, self.timeout)
            for out in errors:
                out["evalue"] = f"{out.get('evalue', '')} {note}"
                out["traceback"] = list(out.get("traceback", [])) + [note]
        return cell, resources


def configure(c: Any) -> None:
    """Set the course's execution limits on a traitlets config ``c`` (an ``nbgrader_config.py``)."""
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput
    from nbgrader.validator import Validator

    c.Execute.timeout = CELL_TIMEOUT_S
    c.Execute.interrupt_on_timeout = True
    c.Execute.error_on_timeout = timeout_error()
    # Validate (the button and `make check`) runs nbgrader's Execute; this one names a cell stopped by the limit
    Validator.preprocessors = [CheckCellMetadata, ClearOutput, ValidateExecute]


# Validate in the student's JupyterLab (which serves work/, where the course's nbgrader_config.py is
# not) and `make check` read this, from JUPYTER_CONFIG_PATH: the same limits as the grader.
STUDENT_NBGRADER_CONFIG = """# written by gpulab (make lab, make check): the course's execution limits (gpulab/course/execution.py)
from gpulab.course.execution import configure

configure(get_config())  # noqa: F821 - provided by nbgrader
"""


def write_nbgrader_config(folder: str | Path) -> Path:
    """Write the student's ``nbgrader_config.py`` (which calls :func:`configure`) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nbgrader_config.py"
    path.write_text(STUDENT_NBGRADER_CONFIG)
    return path
