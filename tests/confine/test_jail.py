"""gpulab.confine.jail: the kernel's box refuses writes outside it, reads of the instructor's files and too much
memory, and logs what it refused; the read grant covers everything but the denied folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.autograde import notes
from gpulab.confine.jail import landlock_abi


def _jail(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "probe_mod.py").write_text(code)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "gpulab.confine.jail", *args, "--", "-m", "probe_mod"],
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


def test_jail_memory_limit_raises_memory_error_in_the_student_code(tmp_path: Path) -> None:
    code = "try:\n    b = bytearray(1536 * 2**20)\nexcept MemoryError:\n    print('MemoryError')\n"
    proc = _jail(tmp_path, code, "--memory-mb", "512")
    assert proc.returncode == 0 and "MemoryError" in proc.stdout, proc.stderr
    assert "MemoryError" not in _jail(tmp_path, code, "--memory-mb", "0").stdout


def test_audit_hook_lets_the_most_specific_rule_win(tmp_path: Path) -> None:
    # the kernel's own folder lies inside the denied grading folder: readable; a denied course inside an
    # allowed folder (the private /tmp): refused, and logged
    from gpulab.confine.jail import file_guard
    log: list[dict] = []
    hook = file_guard(None, log.append, unreadable=[str(tmp_path / "grading"), str(tmp_path / "tmp" / "course")],
                      readable=[str(tmp_path / "grading" / "me"), str(tmp_path / "tmp")])
    hook("open", (str(tmp_path / "grading" / "me" / "data.csv"), "r", 0))
    hook("open", (str(tmp_path / "tmp" / "scratch.bin"), "r", 0))
    for denied in (tmp_path / "grading" / "classmate" / "gradebook.db", tmp_path / "tmp" / "course" / "lab.ipynb"):
        with pytest.raises(PermissionError, match="not allowed"):
            hook("open", (str(denied), "rb", 0))
    assert [e["path"] for e in log] == [str(tmp_path / "grading" / "classmate" / "gradebook.db"),
                                        str(tmp_path / "tmp" / "course" / "lab.ipynb")]
    # writes: the private /tmp is writable, a checkout kept read-only inside it (nsinit --keep) is not
    log.clear()
    hook = file_guard([str(tmp_path / "tmp")], log.append, unwritable=[str(tmp_path / "tmp" / "checkout")])
    hook("open", (str(tmp_path / "tmp" / "scratch.bin"), "w", 0))
    with pytest.raises(PermissionError, match="not allowed"):
        hook("open", (str(tmp_path / "tmp" / "checkout" / "gpulab" / "grading" / "checks.py"), "w", 0))
    assert [e["path"] for e in log] == [str(tmp_path / "tmp" / "checkout" / "gpulab" / "grading" / "checks.py")]


def test_readable_paths_grant_everything_but_the_denied_folders(tmp_path: Path) -> None:
    from gpulab.confine.jail import readable_paths
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


def test_repository_secrets_name_git_and_every_checkouts_course(tmp_path: Path) -> None:
    from gpulab.confine.jail import repository_secrets
    repo = Path(__file__).resolve().parents[2]
    # a course copied outside any repository still hides the checkout gpulab runs from
    found = repository_secrets(tmp_path)
    if not (repo / ".git").exists():
        pytest.skip("gpulab is not running from a git checkout")
    assert repo / ".git" in found and repo / "notebooks" in found
    assert any(p.name == ".git" and p.is_dir() for p in found)  # the repository's own git folder
    assert repo / "gpulab" not in found and all(not (repo / "gpulab").is_relative_to(p) for p in found)


def test_allowed_folders_inside_an_unlistable_denied_folder_are_still_granted(tmp_path: Path, monkeypatch) -> None:
    # a kernel under a uid of its own may pass through the grading folder (0711) but not list it:
    # its own folders inside must be granted by name
    import os

    from gpulab.confine import jail
    grading = tmp_path / "grading"
    for d in ("lab/me/tmp", "lab/me/work", "lab/mate/tmp"):
        (grading / d).mkdir(parents=True)
    real_scandir = os.scandir

    def scandir(path):  # os.scandir's signature
        if str(path).startswith(str(grading)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(jail.os, "scandir", scandir)
    mine = [str(grading / "lab/me/tmp"), str(grading / "lab/me/work")]
    grant = jail.readable_paths([str(grading)], mine)
    assert [g for g in grant if g.startswith(str(grading))] == mine


def test_signals_to_its_own_jobs_are_not_noted(tmp_path: Path) -> None:
    # lab 06's script grader: jobs in sessions of their own, waited for (reaped), then each group swept
    code = """
import os, signal, subprocess, time
done = subprocess.Popen(["sleep", "0"], start_new_session=True)
done.wait()
try:
    os.killpg(done.pid, signal.SIGKILL)
except ProcessLookupError:
    print("already gone")
live = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
time.sleep(0.3)
os.killpg(live.pid, signal.SIGKILL)
print("live", live.wait())
"""
    proc = _jail(tmp_path, code, "--audit-log", str(tmp_path / "log.jsonl"), "--write", str(tmp_path))
    assert "already gone" in proc.stdout and "live -9" in proc.stdout, proc.stdout + proc.stderr
    _, refused, _ = notes.read_write_log(tmp_path / "log.jsonl")
    assert notes.write_notes(refused, []) == []
