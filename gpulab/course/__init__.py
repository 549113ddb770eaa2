"""The nbgrader course workflow behind the make targets: release, copy-work, check, grade, feedback.

``notebooks/`` is the nbgrader course root. ``notebooks/source/<lab>/`` holds the only
hand-edited copy of each lab; everything else there is generated. A student's own copies live in
``work/`` and are never overwritten.
"""

from gpulab.course.nbgrader_cli import find_labs, nbgrader
from gpulab.course.release import check_work, copy_work, release

__all__ = ["find_labs", "nbgrader", "release", "copy_work", "check_work"]
