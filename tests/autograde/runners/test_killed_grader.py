"""A ``make grade`` killed with SIGKILL mid-class leaves no process of any submission behind, and the
next run grades what is missing (issue 49: the runner stage owns every sandbox's life)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import lab_class

from gpulab.autograde import gradebook
from gpulab.confine import isolation

LAB = "00_setup"
FULL, BLANK = ("kia", "lev"), ("mo",)


def _course(tmp: Path) -> Path:
    return lab_class(tmp / "course", LAB, FULL, BLANK)


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of ``pid``, None once it is gone (a zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else (int(fields[1]), fields[19].decode())


def _descendants(root: int) -> dict[int, str]:
    """Every live descendant of ``root``: pid -> start time (so a reused pid is not mistaken for it)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            parents[int(name)] = st
    out, frontier = {}, {root}
    while frontier:
        frontier = {p for p, (pp, _) in parents.items() if pp in frontier and p not in out}
        out.update({p: parents[p][1] for p in frontier})
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _grade(course: Path) -> list[str]:
    cmd = [sys.executable, "-m", "gpulab.autograde", "--course", str(course), "--lab", LAB, "--jobs", "1",
           "--memory-mb", "2048", "--quiet"]
    return cmd + (["--allow-weaker-sandbox"] if isolation.detect().off() else [])


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the parent-death signal is Linux's")
def test_a_grader_killed_mid_class_leaves_nothing_behind_and_the_next_run_finishes(tmp_path: Path) -> None:
    course = _course(tmp_path)
    grader = subprocess.Popen(_grade(course), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    deadline, kernel = time.monotonic() + 600, None
    try:
        while time.monotonic() < deadline and grader.poll() is None:  # until a submission's kernel runs
            procs = _descendants(grader.pid)
            if any("--student=" in _cmdline(p) for p in procs) and any("ipykernel" in _cmdline(p) for p in procs):
                kernel = procs
                break
            time.sleep(0.2)
        assert kernel, "no submission's kernel was seen running before the class was graded"
        os.kill(grader.pid, signal.SIGKILL)  # as a closed terminal's or the OOM killer's: no handler runs
        grader.wait()
        gone_by = time.monotonic() + 20
        while time.monotonic() < gone_by and any(_stat(p) and _stat(p)[1] == t for p, t in kernel.items()):
            time.sleep(0.2)
        left = {p: _cmdline(p)[:120] for p, t in kernel.items() if _stat(p) and _stat(p)[1] == t}
        assert left == {}, f"processes of the killed grader's class still run 20 s later: {left}"
    finally:
        if grader.poll() is None:
            os.killpg(grader.pid, signal.SIGKILL)
            grader.wait()
    done = subprocess.run(_grade(course), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with open(course / "grades.csv") as fh:
        table = {r["student"]: r for r in csv.DictReader(fh)}
    assert set(table) == set(FULL + BLANK), table
    for s in FULL:
        manual = gradebook.manual_points(course, LAB, s)
        assert float(table[s]["score"]) == float(table[s]["max_score"]) - manual > 0, table[s]
    assert float(table[BLANK[0]]["score"]) == 0, table[BLANK[0]]
