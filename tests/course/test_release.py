"""gpulab.course.release: copy-work never overwrites a student's edits; unknown labs and a missing release
say what to run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import COURSE

from gpulab.course.release import copy_work, release


def test_copy_work_keeps_existing_files(tmp_path: Path) -> None:
    course = tmp_path / "course"
    (course / "release" / "00_setup").mkdir(parents=True)
    (course / "release" / "00_setup" / "00_setup.ipynb").write_text("release v1")
    work = tmp_path / "work"
    copied, kept = copy_work(course, work)
    assert [p.name for p in copied] == ["00_setup.ipynb"] and kept == []
    (work / "00_setup" / "00_setup.ipynb").write_text("my edits")
    (course / "release" / "00_setup" / "00_setup.ipynb").write_text("release v2")
    (course / "release" / "00_setup" / "extra.py").write_text("new file")
    copied, kept = copy_work(course, work)
    assert (work / "00_setup" / "00_setup.ipynb").read_text() == "my edits"
    assert (work / "00_setup" / "extra.py").read_text() == "new file"
    assert [p.name for p in copied] == ["extra.py"] and [p.name for p in kept] == ["00_setup.ipynb"]


def test_copy_work_without_release_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="make release"):
        copy_work(tmp_path, tmp_path / "work")


def test_release_unknown_lab_lists_the_labs(tmp_path: Path) -> None:
    shutil.copytree(COURSE / "source", tmp_path / "source")
    with pytest.raises(SystemExit, match="00_setup"):
        release(tmp_path, "99_nope")
