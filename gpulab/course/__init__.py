"""The nbgrader course workflow behind the make targets: release, copy-work, check, collect, grade,
feedback (see docs/instructor.md).

Grading at scale: ``grade`` (parallel orchestration, grades.csv) runs ``sandbox`` (one submission
in an isolated course copy) with ``integrity`` (checks against the gradebook), ``execute`` and
``jail`` (the kernel's limits), then ``gradebook`` merges the result; ``feedback`` keeps hidden
tests out of the HTML; ``collect`` wraps zip_collect.

``notebooks/`` is the nbgrader course root. ``notebooks/source/<lab>/`` holds the only
hand-edited copy of each lab; everything else there is generated. A student's own copies live in
``work/`` and are never overwritten.
"""

from gpulab.course.nbgrader_cli import find_labs, nbgrader
from gpulab.course.release import check_work, copy_work, release

__all__ = ["find_labs", "nbgrader", "release", "copy_work", "check_work"]
