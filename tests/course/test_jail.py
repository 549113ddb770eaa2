"""The course tools: copy-work never overwrites a student's edits; grading survives a corrupt
submission and still grades the others."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from conftest import COURSE

from gpulab.course import grade as grading_run
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


@pytest.mark.notebook
@pytest.mark.timeout(900)
def test_grade_reports_a_corrupt_submission_and_grades_the_rest(tmp_path: Path) -> None:
    course = tmp_path
    shutil.copytree(COURSE / "source", course / "source")
    shutil.copy(COURSE / "nbgrader_config.py", course)
    release(course, "00_setup")
    good = course / "submitted" / "alice" / "00_setup"
    shutil.copytree(course / "source" / "00_setup", good)
    bad = course / "submitted" / "bob" / "00_setup"
    bad.mkdir(parents=True)
    (bad / "00_setup.ipynb").write_text('{"cells": [ this is not json')
    rows = grading_run.grade(course, "00_setup")
    by_student = {r.student: r for r in rows}
    assert by_student["alice"].score == by_student["alice"].max_score > 0
    assert by_student["bob"].score == 0 and "not valid JSON" in by_student["bob"].notes
    with open(course / "grades.csv") as fh:
        table = {r["student"]: r for r in csv.DictReader(fh)}
    assert set(table) == {"alice", "bob"} and "resubmit" in table["bob"]["notes"]


# ---- the grading sandbox, piece by piece (fast: no nbgrader run) ----

import subprocess  # noqa: E402
import sys  # noqa: E402

import nbformat  # noqa: E402

from gpulab.course import feedback as fb  # noqa: E402
from gpulab.course import integrity, notes  # noqa: E402
from gpulab.course.__main__ import main as course_main  # noqa: E402
from gpulab.course.collect import default_regexp  # noqa: E402
from gpulab.course.execute import KERNEL_DIED, NOT_RUN, TIMEOUT, error_output, swap_execute  # noqa: E402
from gpulab.course.jail import landlock_abi  # noqa: E402
from gpulab.course.sandbox import Limits  # noqa: E402

SOURCE_NB = COURSE / "source" / "00_setup" / "00_setup.ipynb"


def _spec_from_source() -> integrity.NotebookSpec:
    """What the gradebook holds for lab 00, read from the source notebook (test cells in full)."""
    nb = nbformat.read(str(SOURCE_NB), as_version=4)
    cells = []
    for c in nb.cells:
        m = c.metadata.get("nbgrader")
        if m:
            cells.append(integrity.CellSpec(m["grade_id"], c.cell_type, c.source, None, m["locked"], grade=m["grade"],
                                             solution=m["solution"], points=m.get("points")))
    return integrity.NotebookSpec("00_setup", cells)


def _ids(nb: nbformat.NotebookNode) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]


def test_repair_leaves_an_untouched_notebook_alone() -> None:
    nb = nbformat.read(str(SOURCE_NB), as_version=4)
    nb.cells[-1].source += "\n"  # whitespace is not an edit
    assert integrity.repair(nb, _spec_from_source()) == []


def test_repair_restores_deleted_tests_in_place_and_reports_edits() -> None:
    spec = _spec_from_source()
    nb = nbformat.read(str(SOURCE_NB), as_version=4)
    before = _ids(nb)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                not in ("place_ranks_impl", "placement_for_machines", "triage_doctor_reports")]
    edited = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "to_device_nested")
    edited.source = "pass"
    unflag = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "backend_for_machines")
    unflag.metadata["nbgrader"]["grade"] = False
    found = integrity.repair(nb, spec)
    assert "test cell to_device_nested was edited; graded with the original" in found
    assert "cell backend_for_machines: nbgrader flags grade were changed; restored" in found
    assert sum("was deleted; restored" in n for n in found) == 2
    assert _ids(nb) == [i for i in before if i != "place_ranks_impl"]
    restored = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "triage_doctor_reports")
    assert restored.metadata["nbgrader"]["grade"] and restored.metadata["nbgrader"]["points"] == 2
    assert "BEGIN HIDDEN TESTS" in restored.source
    nbformat.validate(nb)


def test_unreadable_notebooks_get_a_note_that_names_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "00_setup.ipynb"
    bad.write_text('{"cells": [ oops')
    with pytest.raises(integrity.UnreadableNotebook, match="not valid JSON.*resubmit"):
        integrity.read_notebook(bad)
    bad.write_text('{"hello": 1}')
    with pytest.raises(integrity.UnreadableNotebook, match="JSON but not a Jupyter notebook"):
        integrity.read_notebook(bad)


def test_limits_reject_bad_values_with_the_fix() -> None:
    with pytest.raises(ValueError, match="positive"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="at least 256 MiB"):
        Limits(memory_mb=100)
    with pytest.raises(ValueError, match="'data' or 'as'"):
        Limits(memory_rlimit="rss")
    assert Limits(memory_mb=0).memory_mb == 0  # 0 switches the cap off


def test_grade_rejects_bad_jobs_and_unknown_labs(tmp_path: Path) -> None:
    shutil.copytree(COURSE / "source", tmp_path / "source")
    with pytest.raises(ValueError, match="at least 1"):
        grading_run.grade(tmp_path, jobs=0)
    with pytest.raises(ValueError, match="00_setup"):
        grading_run.grade(tmp_path, "99_nope")
    assert course_main(["grade", "--course", str(tmp_path), "--jobs", "1", "--memory-mb", "10"]) == 2
    assert course_main(["collect", "--course", str(tmp_path), "--archive", "x.zip"]) == 2


def test_swap_execute_replaces_only_nbgraders_execute() -> None:
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute

    default = Autograde.class_traits()["autograde_preprocessors"].default()
    swapped = swap_execute()
    assert len(swapped) == len(default) and Execute not in swapped
    assert [p for p in swapped if p.__name__ != "SandboxedExecute"] == [p for p in default if p is not Execute]
    with pytest.raises(ValueError, match="Execute"):
        swap_execute([])


def _jail(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "probe_mod.py").write_text(code)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "gpulab.course.jail", *args, "--", "-m", "probe_mod"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)


def test_jail_refuses_writes_outside_and_logs_them(tmp_path: Path) -> None:
    ok, outside = tmp_path / "ok", tmp_path / "outside"
    ok.mkdir()
    outside.mkdir()
    code = f"""
import os, ctypes
open({str(ok / 'fine.txt')!r}, "w").write("ok")
for path in [{str(outside / 'py.txt')!r}, {str(ok / '..' / 'outside' / 'dots.txt')!r}]:
    try:
        open(path, "w").write("x")
    except PermissionError as err:
        print("refused", err)
libc = ctypes.CDLL(None, use_errno=True)
print("ctypes fd", libc.open({str(outside / 'c.txt').encode()!r}, os.O_WRONLY | os.O_CREAT, 0o644))
"""
    proc = _jail(tmp_path, code, "--write", str(ok), "--audit-log", str(tmp_path / "log.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert (ok / "fine.txt").read_text() == "ok"
    assert proc.stdout.count("refused gpulab grading sandbox") == 2
    assert not (outside / "py.txt").exists() and not (outside / "dots.txt").exists()
    landlock, refused, reads = notes.read_write_log(tmp_path / "log.jsonl")
    assert refused == [str(outside / "py.txt"), str(outside / "dots.txt")] and reads == []
    assert landlock == bool(landlock_abi())
    if landlock:  # Landlock also stops what bypasses Python's file API
        assert "ctypes fd -1" in proc.stdout and not (outside / "c.txt").exists()


def test_kernel_environment_keeps_every_cache_in_the_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch writes TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_<user> into os.environ the first time
    # the grader process imports torch._dynamo; a kernel that inherits it writes outside its box.
    import torch._dynamo  # noqa: F401

    from gpulab.course.sandbox import _env
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_elsewhere")
    monkeypatch.setenv("TMPDIR", "/tmp")
    env = _env(tmp_path, Limits())
    for key in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert Path(env[key]).is_relative_to(tmp_path / "tmp"), (key, env[key])


def test_jail_refuses_reading_the_instructors_files_and_logs_it(tmp_path: Path) -> None:
    secret, public = tmp_path / "course" / "source", tmp_path / "public"
    secret.mkdir(parents=True)
    public.mkdir()
    (secret / "answers.txt").write_text("hidden tests")
    (public / "data.txt").write_text("data")
    code = f"""
import subprocess
print("public", open({str(public / 'data.txt')!r}).read())
for path in [{str(secret / 'answers.txt')!r}, {str(public / '..' / 'course' / 'source' / 'answers.txt')!r}]:
    try:
        print("LEAK", open(path).read())
    except PermissionError as err:
        print("refused", err)
print("cat says", subprocess.run(["cat", {str(secret / 'answers.txt')!r}], capture_output=True, text=True).stdout or "nothing")
import torch  # the libraries stay readable
"""
    proc = _jail(tmp_path, code, "--no-read", str(tmp_path / "course"), "--audit-log", str(tmp_path / "log.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert "public data" in proc.stdout and "LEAK" not in proc.stdout
    assert proc.stdout.count("refused gpulab grading sandbox: reading") == 2
    landlock, refused, reads = notes.read_write_log(tmp_path / "log.jsonl")
    assert refused == [] and reads == [str(secret / "answers.txt")]  # both spellings resolve to one file
    if landlock:
        assert "cat says nothing" in proc.stdout
    assert notes.write_notes([], [], reads) == [f"tried to read the instructor's files: {secret / 'answers.txt'} (refused)"]


def test_readable_paths_grant_everything_but_the_denied_folders(tmp_path: Path) -> None:
    from gpulab.course.readguard import readable_paths
    (tmp_path / "course" / "source").mkdir(parents=True)
    (tmp_path / "course" / "release").mkdir()
    (tmp_path / "course" / "gradebook.db").write_text("")
    (tmp_path / "lib").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "course" / "source")
    grant = readable_paths([str(tmp_path / "course" / "source"), str(tmp_path / "course" / "gradebook.db")])
    assert str(tmp_path / "lib") in grant and str(tmp_path / "course" / "release") in grant
    assert not any(g.startswith(str(tmp_path / "course" / "source")) for g in grant)
    assert str(tmp_path / "course") not in grant and str(tmp_path) not in grant  # ancestors are expanded, not granted
    assert str(tmp_path / "course" / "gradebook.db") not in grant and str(tmp_path / "link") not in grant
    assert "/usr" in grant
    with pytest.raises(ValueError, match="could not load Python"):
        readable_paths(["/"])


def test_jail_memory_limit_raises_memory_error_in_the_student_code(tmp_path: Path) -> None:
    code = "try:\n    b = bytearray(1536 * 2**20)\nexcept MemoryError:\n    print('MemoryError')\n"
    proc = _jail(tmp_path, code, "--memory-mb", "512")
    assert proc.returncode == 0 and "MemoryError" in proc.stdout, proc.stderr
    assert "MemoryError" not in _jail(tmp_path, code, "--memory-mb", "0").stdout


def test_notes_name_the_cell_and_the_limit(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    for i, (gid, out) in enumerate([("loop_impl", error_output(TIMEOUT, "")),
                                    ("hog_impl", error_output("MemoryError", "")),
                                    ("exit_impl", error_output(KERNEL_DIED, "")),
                                    ("t1", error_output(NOT_RUN, "")), ("t2", error_output(NOT_RUN, ""))]):
        cell = nbformat.v4.new_code_cell("x", outputs=[out])
        cell.metadata["nbgrader"] = {"grade_id": gid}
        nb.cells.append(cell)
    nbformat.write(nb, str(tmp_path / "lab.ipynb"))
    got = notes.output_notes(tmp_path / "lab.ipynb", 20, 1024)
    assert got == ["cell 0 (loop_impl) stopped at the 20 s cell time limit",
                   "cell 1 (hog_impl) ran out of memory (limit 1024 MiB)",
                   "the kernel died in cell 2 (exit_impl) (os._exit, a signal, or a crash)",
                   "2 later cell(s) of lab.ipynb were not run"]
    log = tmp_path / "nbgrader.log"
    log.write_text("[AutogradeApp | ERROR] boom\n    ValueError: the real reason\n[AutogradeApp | ERROR] There was an error processing x\n")
    assert notes.last_error(log) == "ValueError: the real reason"


def test_hide_hidden_tests_removes_the_code_and_its_traceback() -> None:
    from nbconvert import HTMLExporter

    cell = nbformat.v4.new_code_cell("check(f(1) == 1)\n### BEGIN HIDDEN TESTS\nsecret_case_value = f(12345)\n"
                                     "### END HIDDEN TESTS", outputs=[nbformat.v4.new_output(
                                         "error", ename="GradingError", evalue="f(12345): expected 1",
                                         traceback=["line 3: secret_case_value = f(12345)"])])
    nb = nbformat.v4.new_notebook(cells=[cell])
    lines = {"secret_case_value = f(12345)"}
    raw, _ = HTMLExporter().from_notebook_node(nb)
    assert fb.leaks(raw, lines) == sorted(lines)  # the leak check sees code split by syntax highlighting
    fb.HideHiddenTests().preprocess_cell(cell, {}, 0)
    assert cell.source == "check(f(1) == 1)"
    assert cell.outputs[0].traceback[0] == "GradingError: f(12345): expected 1"
    clean, _ = HTMLExporter().from_notebook_node(nb)
    assert fb.leaks(clean, lines) == []


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
