"""What happened while grading one submission, as short notes for ``grades.csv``: from the
autograded notebook's outputs (time limit, memory, a dead kernel, the grader's own notes), the
jail's log of refused writes, reads and signals, nbgrader's log, and the OS layers' counters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import nbformat

from gpulab.autograde.execute.outputs import KERNEL_DIED, NOT_RUN, OUTPUT_CAPPED, TIMEOUT

# How "out of memory" reads from Python, numpy, torch's CPU allocator and C++ code.
_OOM = re.compile(r"MemoryError|OutOfMemoryError|can't allocate memory|Cannot allocate memory|bad_alloc|"
                  r"Unable to allocate", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _label(cell: nbformat.NotebookNode, index: int) -> str:
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    return f"cell {index} ({grade_id})" if grade_id else f"cell {index}"


def output_notes(path: Path, cell_timeout_s: int | None, memory_mb: int) -> list[str]:
    """Notes for cells of an autograded notebook that hit a limit or lost their kernel."""
    nb = nbformat.read(str(path), as_version=4)
    notes: list[str] = []
    not_run = 0
    seen: dict[str, list[str]] = {}  # what the grader saw, one note per kind, naming every cell
    limit = f"{cell_timeout_s} s cell time limit" if cell_timeout_s else "cell time limit"
    for i, cell in enumerate(nb.cells):
        note = cell.get("metadata", {}).get("gpulab", {}).get("note")
        if isinstance(note, str) and note:
            seen.setdefault(note[:300], []).append(_label(cell, i))
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            if OUTPUT_CAPPED in text:
                dropped = text[text.index(OUTPUT_CAPPED) + len(OUTPUT_CAPPED):].strip(" ]\n")
                notes.append(f"{_label(cell, i)} printed too much output; dropped {dropped}")
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        for out in errors:
            ename, evalue = out.get("ename", ""), _ANSI.sub("", out.get("evalue", ""))
            if ename == NOT_RUN:
                not_run += 1
            elif ename == KERNEL_DIED:
                notes.append(f"the kernel died in {_label(cell, i)} (os._exit, a signal, or a crash)")
            elif ename == TIMEOUT and "was stopped" in evalue:
                notes.append(f"{_label(cell, i)} ran past the {limit}, ignored the interrupt, and its kernel was stopped")
            elif ename == TIMEOUT and not any("was stopped" in o.get("evalue", "") for o in errors):
                notes.append(f"{_label(cell, i)} stopped at the {limit}")
            elif _OOM.search(f"{ename}: {evalue}"):
                cap = f" (limit {memory_mb} MiB)" if memory_mb else ""
                notes.append(f"{_label(cell, i)} ran out of memory{cap}")
    notes = list(dict.fromkeys(notes))  # one note per cell, in notebook order
    for reason, cells in seen.items():
        notes.append(f"{', '.join(cells)}: {reason}")
    if not_run:
        notes.append(f"{not_run} later cell(s) of {path.name} were not run")
    return notes


def read_write_log(path: Path) -> tuple[bool | None, list[str], list[str]]:
    """(whether Landlock was in force, the paths whose writes the jail refused, the paths whose
    reads it refused)."""
    if not path.exists():
        return None, [], []
    landlock, refused, reads, signals = None, [], [], []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn line from a kernel killed mid-write
        if entry.get("event") == "jail":
            landlock = bool(entry.get("landlock"))
        elif entry.get("event") == "signal":
            signals.append(entry["path"])
        elif entry.get("event") == "audit-closed":
            refused.append(AUDIT_CLOSED)
        elif entry.get("path"):
            (reads if entry.get("event") == "read" else refused).append(entry["path"])
    if signals:  # a signal to a process outside the kernel's own: the grader, nbgrader, a classmate
        refused.append(f"a signal to {some(list(dict.fromkeys(signals)))} outside its kernel")
    return landlock, list(dict.fromkeys(refused)), list(dict.fromkeys(reads))


AUDIT_CLOSED = "the audit log: the kernel closed its pipe while it ran"


def some(paths: Sequence[str]) -> str:
    """The first three of ``paths``, and how many more."""
    more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
    return ", ".join(paths[:3]) + more


def write_notes(refused: Sequence[str], strays: Sequence[str], reads: Sequence[str] = ()) -> list[str]:
    """Notes for files outside the submission's folder: refused writes, writes that got through,
    and refused reads of the instructor's files."""
    notes = []
    signals = [r for r in refused if r.startswith("a signal to ")]
    if AUDIT_CLOSED in refused:
        notes.append("closed its audit log while the kernel ran: what it tried after that is not known")
    refused = [r for r in refused if r not in signals and r != AUDIT_CLOSED]
    if refused:
        notes.append(f"tried to write outside its folder: {some(refused)} (refused)")
    if signals:
        notes.append(f"tried to send {signals[0][2:]} (the grader, nbgrader or a classmate)")
    if strays:
        notes.append(f"wrote outside its folder (in the grading copy, not the course): {some(strays)}")
    if reads:
        notes.append(f"tried to read the instructor's files: {some(reads)} (refused)")
    return notes


def last_error(log: Path) -> str:
    """The most telling line of a failed nbgrader run."""
    if not log.exists():
        return "no output"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"(Error|Exception):", ln) and "There was an error processing" not in ln:
            return ln[-200:]
    return (lines[-1] if lines else "no output")[-200:]


def isolation_notes(peaks: dict[str, int | None], pids_max: int, memory_mb: int, report: Path,
                    tmp_mb: int = 0, shm_mb: int = 0) -> list[str]:
    """Notes for what the OS isolation stopped: the process cap, the memory cap, a full private
    ``/tmp`` or ``/dev/shm``, and processes that outlived their kernel (from the cgroup's peaks and
    :func:`gpulab.confine.nsinit.report`)."""
    notes = []
    if peaks.get("pids_refused"):
        notes.append(f"hit the cap of {pids_max} processes and threads (pids.max) {peaks['pids_refused']} time(s): "
                     "a fork bomb or runaway threads")
    if peaks.get("oom_kills"):
        notes.append(f"the kernel's memory reached the submission's {memory_mb} MiB cap (cgroup); the OOM killer "
                     f"stopped {peaks['oom_kills']} of its processes")
    try:
        left = json.loads(report.read_text())
    except (OSError, ValueError):
        return notes
    for key, name, cap in (("tmp_used_mb", "/tmp", tmp_mb), ("shm_used_mb", "/dev/shm", shm_mb)):
        used = left.get(key) or 0
        if cap and used >= 0.9 * cap:
            notes.append(f"filled its private {name} ({used:.0f} of {cap} MiB); it was removed with the submission")
    for folder, q in (left.get("quota") or {}).items():
        kind = "autograded" if "/autograded/" in folder else "temp"
        if q.get("cap_mb") and q.get("used_mb", 0) >= 0.9 * q["cap_mb"]:
            notes.append(f"filled its {kind} folder ({q['used_mb']:.0f} of {q['cap_mb']} MiB, a disk of its own); "
                         "its files there were not kept")
        elif q.get("cap_files") and q.get("files", 0) >= 0.9 * q["cap_files"]:
            notes.append(f"created {q['files']} files in its {kind} folder (the cap is {q['cap_files']}); "
                         "its files there were not kept")
        if q.get("not_copied"):
            nc = q["not_copied"]
            notes.append(f"left {nc['apparent_mb']} MiB of files in its {kind} folder ({nc['files']} over the size a "
                         "file may have, by apparent size); none is kept")
        if q.get("copy_error"):
            notes.append(f"its autograded notebook could not be copied out of its folder: {q['copy_error'][:200]}")
    if left.get("left_running"):
        names = list(dict.fromkeys(left["left_running"]))
        notes.append(f"{len(left['left_running'])} process(es) it started outlived its kernel ({some(names)}); "
                     "killed with its namespace")
    return notes
