"""``make lab``: release only what changed, a free port and the URL that works, the student's view (issue 16)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from gpulab.course.lab import (
    INSTRUCTOR_PLUGINS,
    INSTRUCTOR_SERVER_EXTENSIONS,
    NEWS_PLUGIN,
    free_port,
    lab_command,
    stale_labs,
)


def _course(tmp_path: Path) -> Path:
    course = tmp_path / "course"
    for lab in ("00_a", "01_b"):
        (course / "source" / lab).mkdir(parents=True)
        (course / "source" / lab / f"{lab}.ipynb").write_text("{}")
    (course / "nbgrader_config.py").write_text("c = get_config()\n")
    return course


def _release(course: Path, lab: str, when: float) -> None:
    nb = course / "release" / lab / f"{lab}.ipynb"
    nb.parent.mkdir(parents=True, exist_ok=True)
    nb.write_text("{}")
    os.utime(nb, (when, when))


def test_only_labs_whose_source_changed_are_released_again(tmp_path: Path) -> None:
    course = _course(tmp_path)
    assert stale_labs(course) == ["00_a", "01_b"], "nothing released yet: everything"
    later = time.time() + 100
    _release(course, "00_a", later)
    _release(course, "01_b", later)
    assert stale_labs(course) == []
    extra = course / "source" / "01_b" / "data.py"  # any file of the lab counts, not only the notebook
    extra.write_text("x = 1\n")
    os.utime(extra, (later + 5, later + 5))
    assert stale_labs(course) == ["01_b"]
    os.utime(course / "nbgrader_config.py", (later + 9, later + 9))  # the course's config: every lab
    assert stale_labs(course) == ["00_a", "01_b"]


def test_a_taken_port_moves_to_the_next_free_one_and_the_url_says_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        got = free_port(port)
        assert got != port and got > port
        cmd = lab_command(tmp_path, got, config_dir=tmp_path / "cfg", token="abc")
    assert cmd.url == f"http://127.0.0.1:{got}/lab?token=abc"
    assert f"--port={got}" in cmd.argv and "--ServerApp.port_retries=0" in cmd.argv, "Jupyter must not move elsewhere"
    assert cmd.env["JUPYTER_TOKEN"] == "abc" and "abc" not in " ".join(cmd.argv), "the token is not shown in ps"


def test_bad_ports_name_the_fix() -> None:
    with pytest.raises(ValueError, match="PORT=8888"):
        free_port(70000)


def test_the_students_lab_hides_the_instructors_tools_and_the_news(tmp_path: Path) -> None:
    cmd = lab_command(tmp_path, 8888, config_dir=tmp_path / "student")
    assert cmd.env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0] == str(tmp_path / "student")
    page = json.loads((tmp_path / "student" / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert set(INSTRUCTOR_PLUGINS) | {NEWS_PLUGIN} <= set(page)
    assert "@jupyter/nbgrader:validate-assignment" not in page, "the Validate button stays"
    server = json.loads((tmp_path / "student" / "jupyter_server_config.json").read_text())
    assert server["ServerApp"]["jpserver_extensions"] == {e: False for e in INSTRUCTOR_SERVER_EXTENSIONS}

    lab_command(tmp_path, 8888, instructor=True, config_dir=tmp_path / "instructor")
    page = json.loads((tmp_path / "instructor" / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert list(page) == [NEWS_PLUGIN], "the instructor sees everything but the news"


@pytest.mark.notebook
@pytest.mark.timeout(300)
def test_validate_in_the_students_lab_keeps_the_courses_limit(tmp_path: Path) -> None:
    """The Validate button of the student's JupyterLab (which serves work/, where the course's
    nbgrader_config.py is not) runs a 60 s cell to the end, as the grader does: nbgrader's own
    default of 30 s would have cut it and failed the test after it."""
    import subprocess
    import urllib.request

    import nbformat

    work = tmp_path / "work"
    (work / "00_x").mkdir(parents=True)
    slow = nbformat.v4.new_code_cell("import time\ntime.sleep(40)\nanswer = 42")
    test = nbformat.v4.new_code_cell("assert answer == 42")
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t", "points": 1, "locked": True,
                                 "schema_version": 3}
    nbformat.write(nbformat.v4.new_notebook(cells=[slow, test]), str(work / "00_x" / "x.ipynb"))
    cmd = lab_command(work, free_port(8950), config_dir=tmp_path / "config")
    proc = subprocess.Popen(cmd.argv, cwd=cmd.cwd, env=cmd.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{cmd.port}"
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api?token={cmd.token}", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        req = urllib.request.Request(f"{base}/assignments/validate?token={cmd.token}",
                                     data=b"path=00_x%2Fx.ipynb", method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=250) as resp:
            result = json.loads(resp.read())
        assert time.perf_counter() - t0 > 38  # the cell ran to the end, past nbgrader's 30 s
        assert result["success"], result
        value = result["value"] if isinstance(result["value"], dict) else json.loads(result["value"])
        assert not value.get("failed"), value
    finally:
        proc.terminate()
        proc.wait(30)
