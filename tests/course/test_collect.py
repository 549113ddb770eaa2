"""gpulab.course.collect: the default file-name pattern and the Canvas one the docs give."""

from __future__ import annotations

from gpulab.course.collect import default_regexp


def test_default_collect_pattern_and_the_documented_canvas_pattern() -> None:
    import re

    pattern = re.compile(default_regexp(["00_setup"]))
    for path, student in [("/d/extracted/s/alice_00_setup.ipynb", "alice"), ("/d/extracted/s/bob/00_setup.ipynb", "bob"),
                          ("/d/extracted/s/carol_smith_00_setup.ipynb", "carol_smith")]:
        m = pattern.match(path)
        assert m and m["student_id"] == student and m["file_id"] == "00_setup", path
    assert pattern.match("/d/extracted/s/Untitled.ipynb") is None
    canvas = re.compile(r".*/(?P<student_id>[a-z]+)_(?:late_)?\d+_\d+_(?P<file_id>00_setup)(?:-\d+)?\.ipynb$")
    m = canvas.match("/d/extracted/submissions/doejane_late_23456_789012_00_setup-1.ipynb")
    assert m and (m["student_id"], m["file_id"]) == ("doejane", "00_setup")
