"""tests/cellgrade.py, the design tests' harness, judges as make grade does: on the probe lab of
tests/course/test_measured_grading.py, the source's answers pass, a wrong value and a serial loop fail
with the grader's messages, and a measured check is measured."""

from __future__ import annotations

import shutil

import nbformat
from autograde.test_measured_grading import FAST_SUM, LAB, SERIAL, _notebook
from cellgrade import grade_cells
from conftest import COURSE


def test_the_harness_grades_like_the_grader(tmp_path) -> None:
    (tmp_path / "source" / LAB).mkdir(parents=True)
    shutil.copy(COURSE / "nbgrader_config.py", tmp_path)
    nbformat.write(_notebook(), str(tmp_path / "source" / LAB / f"{LAB}.ipynb"))
    tests = ["fast_sum_sums", "overlapped_overlaps"]
    wrong_sum = "def fast_sum(n, seed):\n    return float(n) / 2\n"
    got = grade_cells(LAB, {"source": {}, "wrong_sum": {"fast_sum_impl": wrong_sum},
                            "serial": {"overlapped_impl": SERIAL}, "same": {"fast_sum_impl": FAST_SUM}},
                      tests, course=tmp_path)
    assert all(got["source"][t].passed for t in tests), got["source"]
    assert all(got["same"][t].passed for t in tests)
    assert not got["wrong_sum"]["fast_sum_sums"].passed and "fast_sum(3, 0)" in got["wrong_sum"]["fast_sum_sums"].message
    serial = got["serial"]["overlapped_overlaps"]
    assert not serial.passed and "a read is not overlapped" in serial.message, serial
    assert "measured by the grader" in got["source"]["overlapped_overlaps"].figures[0]
