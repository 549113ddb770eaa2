"""What a grading run will do, before it does it: the submissions, what a stopped run already
finished (the resume ledger), how many jobs and which CPUs each gets, and the labs registered in
the gradebook."""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path

import psutil

from gpulab.accounts import students
from gpulab.autograde import gradebook
from gpulab.autograde.nbgrader import nbgrader
from gpulab.autograde.record import NOT_YET, GradeRow


def submissions(course: Path, lab: str | None = None) -> list[tuple[str, str]]:
    """(student, lab) pairs found under ``submitted/``, sorted."""
    root = Path(course) / "submitted"
    if not root.is_dir():
        return []
    pairs = []
    for student in sorted(p for p in root.iterdir() if p.is_dir()):
        for lab_dir in sorted(p for p in student.iterdir() if p.is_dir()):
            if lab is None or lab_dir.name == lab:
                pairs.append((student.name, lab_dir.name))
    return pairs


def ensure_released(course: Path, labs: set[str]) -> None:
    """The gradebook must know a lab's test cells before it can grade it."""
    for lab in sorted(labs):
        if gradebook.max_score(course, lab) == 0.0:
            proc = nbgrader(course, "generate_assignment", lab, "--force")
            if proc.returncode != 0:
                raise RuntimeError(f"cannot register {lab} in the gradebook:\n{proc.stderr[-2000:]}")


def default_jobs() -> int:
    """One worker per core (each autograde is one busy kernel)."""
    return max(1, psutil.cpu_count(logical=True) or 1)


def default_memory_mb(jobs: int) -> int:
    """4 GiB per kernel, or less so that ``jobs`` kernels fit in 80 % of this machine's memory."""
    return int(min(4096, 0.8 * psutil.virtual_memory().total / 2**20 / max(jobs, 1)))


def cpu_slots(jobs: int, cpus: list[int] | None = None) -> list[list[int]]:
    """One CPU set per parallel grader, ``len(cpus) // jobs`` CPUs each, disjoint while there are enough:
    a kernel and the reference run get as many CPUs, and a classmate graded meanwhile other ones."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    k = max(1, len(cpus) // jobs)
    return [[cpus[(i * k + j) % len(cpus)] for j in range(k)] for i in range(jobs)]


# ---- resuming a run that was stopped --------------------------------------------------------------

def fingerprint(folder: Path) -> str:
    """A hash of the regular files under a submission folder (names and bytes; links are not followed)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            h.update(str(path.relative_to(folder)).encode() + b"\0")
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def ledger(course: Path) -> Path:
    """Where a run writes each submission it finished, with the fingerprint it graded."""
    return course / "grading_logs" / "graded.jsonl"


def note_graded(course: Path, student: str, lab: str) -> None:
    with open(ledger(course), "a") as fh:
        fh.write(json.dumps([student, lab, fingerprint(course / "submitted" / student / lab)]) + "\n")


def interrupted_rows(course: Path, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], GradeRow]:
    """After a stopped run (rows that say :data:`NOT_YET`), the rows it finished for unchanged submissions."""
    path = course / "grades.csv"
    if not path.is_file() or not ledger(course).is_file():
        return {}
    with open(path, newline="") as fh:
        old = {(students.from_csv(r["student"]), r["lab"]): r for r in csv.DictReader(fh)}
    if not any(r["notes"] == NOT_YET for r in old.values()):
        return {}  # the last run finished: grade everything again
    graded = {}
    for line in ledger(course).read_text().splitlines():
        try:
            student, lab, digest = json.loads(line)
        except (ValueError, TypeError):
            continue
        graded[(student, lab)] = digest
    kept = {}
    for pair in pairs:
        row = old.get(pair)
        if row is not None and row["notes"] != NOT_YET and pair in graded \
                and graded[pair] == fingerprint(course / "submitted" / pair[0] / pair[1]):
            kept[pair] = GradeRow(pair[0], pair[1], float(row["score"]), float(row["max_score"]),
                                  students.from_csv(row["notes"]))
    return kept


def start_ledger(course: Path) -> None:
    ledger(course).parent.mkdir(parents=True, exist_ok=True)
    ledger(course).write_text("")
