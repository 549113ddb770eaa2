"""gpulab.autograde.nbgrader: nbgrader runs with this interpreter's folder first on PATH (it starts
``alembic`` and ``jupyter`` through PATH), and the labs are the source folders that hold a notebook."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import COURSE

from gpulab.autograde.nbgrader import find_labs, nbgrader, nbgrader_env
from gpulab.labs import LABS


def test_this_interpreters_folder_goes_first_on_path(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin")
    env = nbgrader_env({"EXTRA": "1"})
    assert env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]
    assert env["EXTRA"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert "EXTRA" not in os.environ  # a copy: the caller's environment is left alone


def test_find_labs_lists_folders_with_a_notebook(tmp_path: Path) -> None:
    for name, has_notebook in (("01_b", True), ("00_a", True), ("02_empty", False)):
        (tmp_path / "source" / name).mkdir(parents=True)
        if has_notebook:
            (tmp_path / "source" / name / f"{name}.ipynb").write_text("{}")
    assert find_labs(tmp_path) == ["00_a", "01_b"]
    assert find_labs(COURSE) == [lab.id for lab in LABS]
    with pytest.raises(FileNotFoundError, match="--course notebooks"):
        find_labs(tmp_path / "nowhere")


def test_nbgrader_runs_in_the_course_root(tmp_path: Path) -> None:
    proc = nbgrader(tmp_path, "--version", timeout=120)
    assert proc.returncode == 0 and "nbgrader version" in proc.stdout, proc.stderr
