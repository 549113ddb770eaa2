"""The grader's defences against a hostile submission, piece by piece (fast: no nbgrader run):
links and special files never followed, the static scan, the jail's signal scope and its read
exceptions, the feedback's verdicts read from the grader's outputs only.
The whole class, attacks included, is graded by tests/test_grading_class.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from gpulab.autograde.box import integrity, links
from gpulab.autograde.notes import read_write_log, write_notes
from gpulab.confine.jail import landlock_abi
from gpulab.course import feedback as fb


def _hostile_folder(root: Path, outside: Path) -> Path:
    folder = root / "sub"
    folder.mkdir()
    (folder / "lab.ipynb").write_text("{}")
    (folder / "data").mkdir()
    (folder / "data" / "x.csv").write_text("1,2")
    (folder / "zero.ipynb").symlink_to("/dev/zero")
    (folder / "escape").symlink_to(outside)
    (folder / "out.ipynb").symlink_to(outside / "secret.ipynb")
    os.mkfifo(folder / "pipe.ipynb")
    os.link(outside / "gradebook.db", folder / "hard.ipynb")
    return folder


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "course"
    outside.mkdir()
    (outside / "secret.ipynb").write_text("hidden tests")
    (outside / "gradebook.db").write_text("grades")
    return _hostile_folder(tmp_path, outside), outside


def test_copy_regular_copies_plain_files_and_names_the_rest(hostile, tmp_path: Path) -> None:
    folder, outside = hostile
    skipped = links.copy_regular(folder, tmp_path / "copy", max_bytes=2**20)
    got = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert got == ["data", "data/x.csv", "lab.ipynb"]
    assert sorted(skipped) == ["escape (symlink)", "hard.ipynb (hard link)", "out.ipynb (symlink)",
                               "pipe.ipynb (FIFO)", "zero.ipynb (symlink)"]
    (folder / "big.ipynb").write_bytes(b"x" * 3000)
    assert "big.ipynb (larger than 0 MiB)" in links.copy_regular(folder, tmp_path / "copy2", max_bytes=2000)


def test_copy_regular_stops_at_the_submissions_total_and_copies_notebooks_first(tmp_path: Path) -> None:
    folder = tmp_path / "sub"
    folder.mkdir()
    for name in ("a.bin", "b.bin", "c.bin"):  # sparse: nothing on disk, 3 MiB each to a copy
        with open(folder / name, "wb") as fh:
            fh.truncate(3 * 2**20)
    (folder / "z_lab.ipynb").write_text("{}")
    skipped = links.copy_regular(folder, tmp_path / "copy", max_bytes=4 * 2**20, max_total=7 * 2**20)
    assert skipped == ["c.bin (past the 7 MiB a submission may hold in all)"]
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["a.bin", "b.bin", "z_lab.ipynb"]


def test_remove_unsafe_deletes_links_fifos_and_hard_links_without_following(hostile) -> None:
    folder, outside = hostile
    removed = links.remove_unsafe(folder)
    assert len(removed) == 5 and sorted(p.name for p in folder.iterdir()) == ["data", "lab.ipynb"]
    assert (outside / "secret.ipynb").read_text() == "hidden tests" and (outside / "gradebook.db").exists()


def test_copy_notebooks_copies_back_only_regular_notebooks(hostile, tmp_path: Path) -> None:
    folder, _ = hostile
    skipped = links.copy_notebooks(folder, tmp_path / "back", max_bytes=2**20)
    assert [p.name for p in (tmp_path / "back").iterdir()] == ["lab.ipynb"]
    assert len(skipped) == 4  # zero, out, pipe, hard (the folder link is not a notebook)


def test_scan_flags_what_only_tampering_needs_and_not_the_labs() -> None:
    assert integrity.scan_source("get_ipython().events.register('post_run_cell', f)") == ["IPython events"]
    assert integrity.scan_source("import builtins\nbuiltins.isinstance = lambda *a: True") == ["writes to builtins"]
    assert integrity.scan_source("torch.testing.assert_close = f") == ["attribute assignment on gpulab/torch modules"]
    assert integrity.scan_source("sys.modules['gpulab.grading'] = fake") == ["writes to sys.modules"]
    assert integrity.scan_source("import fcntl; fcntl.ioctl(0, termios.TIOCSTI, c)") == ["ioctl"]
    assert integrity.scan_source("torch.backends.cudnn.benchmark = True\nx = torch.ones(2)\nif a == b: pass") == []
    root = Path(__file__).resolve().parents[1] / "notebooks" / "source"
    for path in sorted(root.glob("*/*.ipynb")):  # the labs' own solutions need none of it
        nb = nbformat.read(str(path), as_version=4)
        assert integrity.scan_notes(nb) == [], path.name


def _jail(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "probe_mod.py").write_text(code)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "gpulab.confine.jail", *args, "--", "-m", "probe_mod"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)


@pytest.mark.skipif(landlock_abi() < 6, reason="Landlock's signal scope needs ABI 6 (Linux 6.12)")
def test_jail_keeps_signals_inside_and_notes_the_attempt(tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = f"""
import os, signal, subprocess
child = subprocess.Popen(["sleep", "60"])
os.kill(child.pid, signal.SIGKILL)  # its own child: allowed
print("child", child.wait())
try:
    os.kill({victim.pid}, signal.SIGKILL)
    print("killed the victim")
except PermissionError:
    print("refused")
"""
        proc = _jail(tmp_path, code, "--audit-log", str(tmp_path / "log.jsonl"), "--write", str(tmp_path))
        assert "child -9" in proc.stdout and "refused" in proc.stdout, proc.stdout + proc.stderr
        assert victim.poll() is None
        _, refused, _ = read_write_log(tmp_path / "log.jsonl")
        assert write_notes(refused, []) == [f"tried to send signal to pid {victim.pid} outside its kernel "
                                            "(the grader, nbgrader or a classmate)"]
    finally:
        victim.kill()
        victim.wait()


def test_jail_reads_its_own_folders_of_a_denied_grading_root(tmp_path: Path) -> None:
    root = tmp_path / "grading"
    mine, other = root / "lab" / "me" / "work", root / "lab" / "classmate" / "tmp"
    for d in (mine, other):
        d.mkdir(parents=True)
    (mine / "ok.txt").write_text("mine")
    (other / "kernel.json").write_text("classmate's key")
    code = f"""
print(open({str(mine / 'ok.txt')!r}).read())
try:
    print("LEAK", open({str(other / 'kernel.json')!r}).read())
except PermissionError:
    print("refused")
"""
    proc = _jail(tmp_path, code, "--no-read", str(root), "--read", str(mine), "--audit-log", str(tmp_path / "l.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert "mine" in proc.stdout and "refused" in proc.stdout and "LEAK" not in proc.stdout


def test_feedback_takes_the_verdict_from_the_grader_never_from_the_kernel() -> None:
    """The feedback page reads a test cell's verdict only where the grader alone writes it (the first
    output of a cell it failed: write_verdict drops the kernel's own errors); whatever the kernel
    forged around it (a display marked as the grader's, an error named as the grader's, a stream that
    reads like a verdict) is not on the page, and neither is the detail the grader quoted from it."""
    from nbconvert import HTMLExporter

    from gpulab.autograde.execute.outputs import error_output, write_verdict
    from gpulab.course import feedback_page as page

    secret = "secret_case_value = f(12345)"
    meta = {"grade": True, "solution": False, "grade_id": "t", "points": 1, "locked": True, "schema_version": 3}
    release = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("check(f(1) == 1)", metadata={"nbgrader": meta})])
    forged = [nbformat.v4.new_output("display_data", data={"text/plain": secret}, metadata={"gpulab": "verdict"}),
              nbformat.v4.new_output("stream", name="stdout", text=f"GradingError: {secret}\n"),
              error_output("NotRunError", secret), error_output("GradingError", secret)]
    for passed in (True, False):
        graded = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"check(f(1) == 1)\n{secret}",
                                                                           metadata={"nbgrader": dict(meta)})])
        graded.cells[0].outputs = [nbformat.NotebookNode(o) for o in forged]
        write_verdict(graded.cells[0], passed, f"f on the hidden cases: raised ValueError: {secret}", [secret])
        assert secret in json.dumps(graded.cells[0].outputs)  # the kernel's forgeries are in the graded notebook
        nb = page.build(None, release, graded, "gone")
        shown = fb.html_text(HTMLExporter().from_notebook_node(nb)[0])
        assert secret not in shown and "ValueError" not in shown, shown[-2000:]
        assert (page.PASSED in shown) == passed and ("failed: f on the hidden cases" in shown) == (not passed)
