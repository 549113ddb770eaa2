"""A fixture class for the grading tests: lab 00 submissions built from the release notebook, the
good ones filled in with the source notebook's solutions, the bad ones broken on purpose.

Each case says what the student did, the score it must get (lab 00 has four test cells of 2
points each: to_device_nested, backend_for_machines, placement_for_machines,
triage_doctor_reports), and a piece of the note ``grades.csv`` must carry for it.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from conftest import COURSE

from gpulab.course.release import release

LAB = "00_setup"
MAX_SCORE = 8.0


@dataclass
class Case:
    """One fixture student: solution-cell overrides (None = leave the release stub), test-cell
    edits, and what grading must report."""

    answers: dict[str, str | None] = field(default_factory=dict)
    edit_tests: dict[str, str] = field(default_factory=dict)   # grade_id -> new source
    delete: tuple[str, ...] = ()                               # grade_ids of cells to remove
    unflag: tuple[str, ...] = ()                               # grade_ids whose "grade" flag is cleared
    raw: str | None = None                                     # the file's bytes instead of a notebook
    file_name: str = f"{LAB}.ipynb"
    score: float = MAX_SCORE
    note: str = ""                                             # a regexp the notes must match


WRONG_BACKEND = '''def choose_backend(machine, world_size):
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError("world_size must be a positive int")
    return "nccl" if machine.usable_gpus >= world_size else "gloo"   # forgets machine.nccl
'''
ESCAPE = '''import os, pathlib
for target in [{course!r} + "/ESCAPED.txt", "../../../ESCAPED.txt"]:
    try:
        pathlib.Path(target).write_text("owned")
    except OSError as err:
        print("refused:", type(err).__name__)
os.system("echo owned > " + {course!r} + "/ESCAPED_SHELL.txt 2>/dev/null")
import subprocess
subprocess.Popen(["sleep", "600"], start_new_session=True)  # detached: must not outlive grading
os.system("sleep 601 &")  # orphaned to init: must not outlive grading either
'''
PEEK = '''for target in [{course!r} + "/source/00_setup/00_setup.ipynb", "../../../gradebook.db"]:
    try:
        open(target, "rb").read()
        print("read", target)
    except OSError as err:
        print("refused:", type(err).__name__)
import os, subprocess
print(subprocess.run(["cat", {course!r} + "/source/00_setup/00_setup.ipynb"], capture_output=True, text=True).stdout)
os.system("cat " + {course!r} + "/source/00_setup/00_setup.ipynb > copied.ipynb 2>/dev/null")  # a stray notebook
'''
STUBBORN = '''import time
while True:
    try:
        time.sleep(0.5)
    except KeyboardInterrupt:
        pass
'''
HOG = '''blocks = []
while True:
    blocks.append(bytearray(64 * 2**20))
'''


def cases(course: Path) -> dict[str, Case]:
    """The fixture class (17 students) for a course copy at ``course``."""
    return {
        "good_ana": Case(), "good_ben": Case(), "good_cho": Case(),
        "partial": Case(answers={"choose_backend_impl": None, "place_ranks_impl": None, "triage_impl": None}, score=2),
        "hidden_fail": Case(answers={"choose_backend_impl": WRONG_BACKEND}, score=6),
        "edited_test": Case(answers={"choose_backend_impl": "def choose_backend(machine, world_size):\n    return 'gloo'"},
                            edit_tests={"backend_for_machines": "pass  # trust me"}, score=6,
                            note=r"test cell backend_for_machines was edited; graded with the original"),
        "deleted_tests": Case(delete=("place_ranks_impl", "placement_for_machines"), score=6,
                              note=r"test cell placement_for_machines was deleted; restored"),
        "unflagged_test": Case(answers={"triage_impl": "def triage(report):\n    return 'ok'"},
                               unflag=("triage_doctor_reports",), score=6, note=r"triage_doctor_reports: nbgrader flags grade"),
        "infinite_loop": Case(answers={"to_device_impl": "while True:\n    pass"}, score=6,
                              note=r"cell \d+ \(to_device_impl\) stopped at the \d+ s cell time limit"),
        "stubborn_loop": Case(answers={"choose_backend_impl": STUBBORN}, score=2,
                              note=r"choose_backend_impl\) ran past the 20 s cell time limit, ignored the interrupt, and its kernel was stopped; 7 later cell\(s\) of 00_setup.ipynb were not run"),
        "memory_hog": Case(answers={"place_ranks_impl": HOG}, score=6, note=r"place_ranks_impl\) ran out of memory"),
        "os_exit": Case(answers={"choose_backend_impl": "import os\nos._exit(3)"}, score=2,
                        note=r"the kernel died in cell \d+ \(choose_backend_impl\)"),
        "sigkill": Case(answers={"triage_impl": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"}, score=6,
                        note=r"the kernel died in cell \d+ \(triage_impl\)"),
        "escapee": Case(answers={"to_device_impl": ESCAPE.format(course=str(course)) + "\n{solution}"},
                        note=r"tried to write outside its folder: .*/ESCAPED.txt, <grading copy>/ESCAPED.txt \(refused\)"),
        "peeker": Case(answers={"choose_backend_impl": PEEK.format(course=str(course)) + "\n{solution}"},
                       note=r"tried to read the instructor's files: .*/source/00_setup/00_setup.ipynb, "
                            r"<grading copy>/gradebook.db \(refused\)"),
        "not_json": Case(raw='{"cells": [ this is not json', score=0, note=r"not valid JSON.*resubmit"),
        "wrong_name": Case(file_name="Untitled.ipynb", score=0, note=r"no 00_setup.ipynb in the submission"),
    }


def make_course(dst: Path) -> Path:
    """A private copy of the course with lab 00 released (and registered in its gradebook)."""
    shutil.copytree(COURSE / "source", dst / "source")
    shutil.copy(COURSE / "nbgrader_config.py", dst / "nbgrader_config.py")
    release(dst, LAB)
    return dst


def _solutions(course: Path) -> dict[str, str]:
    nb = nbformat.read(str(course / "source" / LAB / f"{LAB}.ipynb"), as_version=4)
    out = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            out[meta["grade_id"]] = re.sub(r"\n?\s*### (BEGIN|END) SOLUTION", "", cell.source)
    return out


def student_notebook(course: Path, case: Case) -> nbformat.NotebookNode:
    """The release notebook with the case's answers and edits applied."""
    nb = nbformat.read(str(course / "release" / LAB / f"{LAB}.ipynb"), as_version=4)
    solutions = _solutions(course)
    kept = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id")
        if gid in case.delete:
            continue
        if meta.get("solution"):
            answer = case.answers.get(gid, solutions[gid])
            if answer is not None:
                cell.source = answer.replace("{solution}", solutions[gid])
        if gid in case.edit_tests:
            cell.source = case.edit_tests[gid]
        if gid in case.unflag:
            meta["grade"] = False
        kept.append(cell)
    nb.cells = kept
    return nb


def submit_class(course: Path, chosen: dict[str, Case]) -> None:
    """Write every case into ``submitted/<student>/00_setup/``."""
    for student, case in chosen.items():
        folder = course / "submitted" / student / LAB
        folder.mkdir(parents=True)
        if case.raw is not None:
            (folder / case.file_name).write_text(case.raw)
        else:
            nbformat.write(student_notebook(course, case), str(folder / case.file_name))
