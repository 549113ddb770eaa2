"""Grade one lab the way ``make grade`` does, on its own source and release notebooks (a maintainer's
tool, not part of gpulab): the reference run, then the source notebook as student ``solution`` and
the release notebook as student ``student``, each in its sandbox, judged against the reference run.

    .venv/bin/python tools/gradelab.py 03_hdf5 [--jobs 2] [--keep DIR] [--student NOTEBOOK]

Prints each test cell's verdict for both. ``--student`` grades another notebook as a third student.
Runs hold the lock file /tmp/gpulab-grade.lock, so that two maintainers' runs on one machine do not
time each other's work.
"""

from __future__ import annotations

import argparse
import fcntl
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpulab.autograde.limits import Limits  # noqa: E402
from gpulab.autograde.run import grade  # noqa: E402
from gpulab.confine import isolation  # noqa: E402
from gpulab.course.release import release  # noqa: E402


def verdicts(path: Path) -> list[tuple[str, str]]:
    nb = nbformat.read(str(path), as_version=4)
    out = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            errors = [o for o in cell.outputs if o.get("output_type") == "error"]
            note = cell.metadata.get("gpulab", {}).get("note", "")
            text = "PASS" if not errors else f"FAIL {errors[0].get('ename')}: {errors[0].get('evalue', '')[:400]}"
            out.append((meta["grade_id"], text + (f"  [note: {note}]" if note else "")))
    return out


def grade_lab(lab: str, root: Path, jobs: int = 2, students: list[str] | tuple[str, ...] = ()) -> tuple[list, float]:
    """Release ``lab`` into a course copy at ``root``, submit its source notebook as ``solution`` and
    its release as ``student`` (and each of ``students`` as ``extra<i>``), grade them as ``make grade``
    does, and return (grades.csv's rows, seconds)."""
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(REPO / "notebooks" / "source", root / "source")
    shutil.copy(REPO / "notebooks" / "nbgrader_config.py", root / "nbgrader_config.py")
    with open("/tmp/gpulab-grade.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        release(root, lab)
        shutil.copytree(root / "source" / lab, root / "submitted" / "solution" / lab)
        shutil.copytree(root / "release" / lab, root / "submitted" / "student" / lab)
        for i, nb in enumerate(students):
            dest = root / "submitted" / f"extra{i}" / lab
            shutil.copytree(root / "release" / lab, dest)
            shutil.copy(nb, dest / f"{lab}.ipynb")
        plan = isolation.detect()
        t0 = time.perf_counter()
        rows = grade(root, lab, jobs=jobs, limits=Limits(allow_weaker=True), progress=False, plan=plan)
        return rows, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("lab")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--keep", default=None, help="grade in this folder and keep it")
    p.add_argument("--student", action="append", default=[], help="another notebook to grade as a student")
    args = p.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gradelab-"))
    rows, took = grade_lab(args.lab, root, args.jobs, args.student)
    for r in rows:
        print(f"{r.student:10} {r.score:g}/{r.max_score:g}  {r.notes}")
        for nb in sorted((root / "autograded" / r.student / args.lab).glob("*.ipynb")):
            for gid, text in verdicts(nb):
                print(f"    {gid:45} {text}")
    print(f"graded in {took:.0f} s; course copy in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
