"""Import an LMS download (a zip of submissions) into ``submitted/`` with nbgrader's ``zip_collect``.

By default a file is matched when its name (or its folder and name) is the student id followed by
``_`` or ``/`` and one of the lab's notebook names, anywhere in the archive
(``alice_00_setup.ipynb``, ``bob/00_setup.ipynb``); other layouts need ``--regexp`` with the named
groups ``student_id`` and ``file_id`` (docs/instructor.md gives Canvas's).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.autograde.nbgrader import find_labs, nbgrader


@dataclass
class CollectReport:
    """What zip_collect did: the students whose submission was (re)placed, and the files skipped."""

    students: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    log: str = ""


def default_regexp(notebooks: list[str]) -> str:
    """The default file-name pattern for a lab with these notebook names (see the module doc)."""
    names = "|".join(re.escape(n) for n in sorted(notebooks, key=len, reverse=True))
    return rf".*/(?P<student_id>[^/]+?)[_/](?P<file_id>{names})\.ipynb$"


def lab_notebooks(course: Path, lab: str) -> list[str]:
    """The notebook names of ``lab``, from its source folder."""
    return sorted(p.stem for p in (course / "source" / lab).glob("*.ipynb"))


def collect(course: str | Path, lab: str, archive: str | Path, regexp: str | None = None) -> CollectReport:
    """Copy ``archive`` into ``downloaded/<lab>/archive/`` and run ``nbgrader zip_collect``; a student
    already in ``submitted/`` is replaced. Raises FileNotFoundError, ValueError (an unknown lab, a
    regexp without a named group) or RuntimeError (zip_collect's last log line)."""
    course = Path(course).resolve()
    archive = Path(archive).expanduser().resolve()
    if not archive.is_file():
        raise FileNotFoundError(f"no archive at {archive}: pass the LMS download, e.g. ARCHIVE=~/Downloads/submissions.zip")
    labs = find_labs(course)
    if lab not in labs:
        raise ValueError(f"no lab {lab!r} in {course / 'source'}; the labs are: {', '.join(labs)} (use LAB=...)")
    regexp = regexp or default_regexp(lab_notebooks(course, lab))
    missing = [g for g in ("student_id", "file_id") if f"(?P<{g}>" not in regexp]
    if missing:
        raise ValueError(f"the regexp needs the named group(s) {', '.join(missing)}, e.g. (?P<student_id>[^/_]+)")
    if not (course / "release" / lab).is_dir():
        proc = nbgrader(course, "generate_assignment", lab, "--force")  # zip_collect checks names against it
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment {lab} failed:\n{proc.stderr[-2000:]}")
    inbox = course / "downloaded" / lab / "archive"
    if inbox.exists():
        shutil.rmtree(inbox)  # only this download: an older one would be collected again
    inbox.mkdir(parents=True)
    shutil.copy(archive, inbox / archive.name)
    proc = nbgrader(course, "zip_collect", lab, "--force", f"--FileNameCollectorPlugin.named_regexp={regexp}")
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader zip_collect {lab} failed: {log.strip().splitlines()[-1] if log.strip() else ''}")
    submitted = str(course / "submitted") + "/"
    report = CollectReport(log=log)
    for line in log.splitlines():
        if "Copying to:" in line and submitted in line:
            report.students.append(line.split(submitted, 1)[1].split("/", 1)[0])
        elif "Skipped submission" in line or "did not match anything in" in line:
            report.skipped.append(line.rsplit(": ", 1)[-1].strip())
    report.students = sorted(set(report.students))
    report.skipped = sorted(set(report.skipped))
    return report
