"""What make hub writes before JupyterHub starts: the course id read once, each role's settings,
the exchange, and the folders students' servers must pass through."""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from conftest import REPO

from gpulab.hub import site


def test_the_course_id_is_read_from_the_course_config(tmp_path) -> None:
    assert site.course_id(REPO / "notebooks") == "gpulab"
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    with pytest.raises(ValueError, match="sets no c.CourseDirectory.course_id"):
        site.course_id(tmp_path)
    with pytest.raises(ValueError, match="COURSE="):
        site.course_id(tmp_path / "nope")


@pytest.mark.parametrize("role", ["student", "instructor"])
def test_each_role_gets_its_tools_and_the_same_course_and_exchange(tmp_path, role) -> None:
    folder = site.write_role_config(tmp_path / role, role, "gpulab", "/srv/exchange", tmp_path / "course")
    page = json.loads((folder / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    server = json.loads((folder / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    nbgrader = (folder / "nbgrader_config.py").read_text()
    assert "c.CourseDirectory.course_id = 'gpulab'" in nbgrader and "c.Exchange.root = '/srv/exchange'" in nbgrader
    assert "configure(c)" in nbgrader  # the course's cell timeout for Validate too
    assert server["nbgrader.server_extensions.assignment_list"] and server["nbgrader.server_extensions.validate_assignment"]
    if role == "student":
        assert set(site.STUDENT_HIDDEN_PLUGINS) <= set(page)
        assert "@jupyter/nbgrader:assignment-list" not in page
        assert not server["nbgrader.server_extensions.formgrader"] and not server["nbgrader.server_extensions.course_list"]
        assert "CourseDirectory.root" not in nbgrader
    else:
        assert not set(site.STUDENT_HIDDEN_PLUGINS) & set(page)
        assert server["nbgrader.server_extensions.formgrader"]
        assert f"c.CourseDirectory.root = {str((tmp_path / 'course').resolve())!r}" in nbgrader
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755  # every student's server reads it


@pytest.fixture
def open_dir():
    """A scratch folder every user may pass through (pytest's own tmp_path is private)."""
    d = Path(tempfile.mkdtemp(prefix="gpulab-site-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_exchange_is_writable_by_all_and_sticky(open_dir, tmp_path) -> None:
    ex = site.make_exchange(open_dir / "a" / "exchange")
    assert stat.S_IMODE(ex.stat().st_mode) == 0o1777
    with pytest.raises(ValueError, match="not passable by other users"):
        site.make_exchange(tmp_path / "exchange")  # under pytest's private folder


def test_folders_others_cannot_pass_are_named(open_dir) -> None:
    (open_dir / "private" / "venv").mkdir(parents=True)
    (open_dir / "private").chmod(0o700)
    assert site.blocked_dirs([open_dir / "private" / "venv"]) == [open_dir / "private"]
    (open_dir / "private").chmod(0o711)
    assert site.blocked_dirs([open_dir / "private" / "venv"]) == []
