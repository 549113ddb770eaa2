"""How a kernel runs (its mode) and how a record leaves it.

A kernel runs in one of three modes, set by the process that started it (``GPULAB_GRADING``):

- ``interactive`` (the default: Run All, Validate, ``make check``): each check decides at once;
- ``graded`` (the student's kernel under ``make grade``): each check only sends the value the
  student's code produced, and decides nothing;
- ``reference`` (a clean kernel that runs the lab's source notebook once per grading run): each
  check sends the solution's value (the expected side) and the check itself.

A record crosses as one ``display_data`` message of type :data:`MIME` holding JSON
(:mod:`gpulab.evidence.records`, :mod:`gpulab.evidence.codec`); whatever a kernel sends is only data
to the grader.
"""

from __future__ import annotations

import os

from gpulab.evidence.records import Record, to_wire

MIME = "application/vnd.gpulab.evidence+json"
INTERACTIVE, GRADED, REFERENCE = "interactive", "graded", "reference"


def mode() -> str:
    """``interactive``, ``graded`` or ``reference`` (from ``GPULAB_GRADING``)."""
    m = os.environ.get("GPULAB_GRADING", INTERACTIVE)
    return m if m in (GRADED, REFERENCE) else INTERACTIVE


def emit(record: Record) -> None:
    """Send one record to the grader (a ``display_data`` of type :data:`MIME`)."""
    try:
        from IPython.display import display
    except ImportError:  # not in a kernel: nothing listens
        return
    display({MIME: to_wire(record), "text/plain": ""}, raw=True)
