"""Two small classes beside the lab-00 fixture class (tests/grading_class.py), for what only a lab
with measured checks or launched ranks can show (issue 48):

- lab 01, graded two at a time: an honest copy of the source answers beside the load-shaping
  spinner, a classmate whose first cell starts a busy process on every core of the machine (and
  tries to widen each one's CPU affinity to every core) that spins until its kernel ends, through
  every timed phase of its classmate's and its own. Neither score may move: each is the source's.
- lab 06, alone: the source answers, whose launcher's watchdog signals its own rank group; the
  grader must not report that (or anything) as the student's: no note.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from conftest import COURSE, lab_class

SPINNER = """import multiprocessing as _mp, os as _os
def _spin():
    try:
        _os.sched_setaffinity(0, range(_os.cpu_count()))  # every core, not only this job's
    except OSError as err:
        print("affinity refused:", type(err).__name__)
    while True:
        pass
_spinners = [_mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(_os.cpu_count() or 2)]
for _p in _spinners:
    _p.start()
print("spinning", len(_spinners), "processes")
"""
SPUN_LAB, SPUN_HONEST, SPUN_SPINNER = "01_bottleneck", "honest_01", "spinner_01"
NOTED_LAB, NOTED_HONEST = "06_ddp", "honest_06"


def autograded_points(lab: str) -> float:
    """The source notebook's autograded points: every graded code cell's (the written answers are the instructor's)."""
    nb = nbformat.read(str(COURSE / "source" / lab / f"{lab}.ipynb"), as_version=4)
    return float(sum(c.metadata["nbgrader"].get("points", 0) for c in nb.cells
                     if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")))


def spinner_class(course: Path) -> Path:
    """Lab 01 released at ``course``: the honest copy and the spinner (the source answers, the spinner's cell first)."""
    lab_class(course, SPUN_LAB, full=(SPUN_HONEST, SPUN_SPINNER), blank=())
    path = course / "submitted" / SPUN_SPINNER / SPUN_LAB / f"{SPUN_LAB}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell(SPINNER))
    nbformat.write(nb, str(path))
    return course


def noted_class(course: Path) -> Path:
    """Lab 06 released at ``course``, with the source answers handed in."""
    return lab_class(course, NOTED_LAB, full=(NOTED_HONEST,), blank=())
