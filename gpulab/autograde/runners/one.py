"""Grade one submission: its box (:mod:`gpulab.autograde.box`), its sandboxed run, and what it left
(:mod:`gpulab.autograde.collect`); nothing the student did makes this raise."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gpulab.accounts import students
from gpulab.autograde import notes as notes_mod
from gpulab.autograde.box import integrity
from gpulab.autograde.box.prepare import prepare
from gpulab.autograde.box.run import run_autograde
from gpulab.autograde.collect import collect, snapshot
from gpulab.autograde.limits import LabRun, Limits, SandboxResult
from gpulab.confine import isolation


def grade_in_sandbox(course: Path, template_db: Path, specs: dict[str, integrity.NotebookSpec], lab: str,
                     student: str, box: Path, limits: Limits, cancel: threading.Event | None = None,
                     plan: isolation.Plan | None = None, secrets: list[Path] | None = None,
                     run: LabRun | None = None) -> SandboxResult:
    """Grade one submission in ``box`` (a new folder); never raises for anything the student did.
    ``plan``: this machine's isolation (None: none); ``secrets``: :func:`jail.repository_secrets`;
    ``run``: the lab's reference run and masks (None: every test fails)."""
    t0 = time.perf_counter()
    result = SandboxResult(student, lab, log=box / "nbgrader.log")
    real, student = student, students.alias(student)  # nbgrader sees only the alias
    sub = None
    if plan is not None:
        sub = isolation.Submission(plan, limits.pids_max, limits.cgroup_memory_mb(), limits.tmp_mb, limits.shm_mb)
    try:
        try:
            result.notes += prepare(course, template_db, specs, lab, student, box, limits, sub, secrets, run, real)
        except integrity.UnreadableNotebook as err:
            result.status, result.notes = "unreadable", [str(err)]
            return result
        except FileNotFoundError as err:
            result.status, result.notes = "missing", [str(err)]
            return result
        before = snapshot(box, [box / "autograded", box / "tmp"])
        rc, timed_out = run_autograde(box, lab, student, limits, cancel, sub, run.seed if run else None)
    finally:
        if sub is not None:
            result.peaks = sub.finish()  # also when prepare failed: no cgroup is left behind
    result.seconds = time.perf_counter() - t0
    result.notes += notes_mod.isolation_notes(result.peaks, limits.pids_max, limits.cgroup_memory_mb(),
                                              box / "namespace.json", limits.tmp_mb, limits.shm_mb)
    return collect(result, box, student, lab, specs, limits, rc, timed_out, before)


def grade_safely(course: Path, template: Path, specs: dict, lab: str, student: str, box: Path,
                  limits: Limits, cancel: threading.Event, plan: isolation.Plan, secrets: list[Path],
                  run: LabRun) -> SandboxResult:
    try:
        return grade_in_sandbox(course, template, specs, lab, student, box, limits, cancel, plan, secrets, run)
    except Exception as err:  # a grader bug on one submission must not stop the class
        return SandboxResult(student, lab, status="failed", notes=[f"grader error: {type(err).__name__}: {err}"])


