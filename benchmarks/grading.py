"""Parallel over sequential autograding: the same class of lab 00 submissions graded with one
worker, then with one worker per core, side by side in one run.

    flock /tmp/gpulab-cpu.lock .venv/bin/python benchmarks/grading.py [--submissions 20] [--jobs N]
        [--nbgrader-baseline]

Every submission is the lab's source notebook (full marks), graded by ``gpulab.course.grade``
(nbgrader's own autograde in a sandbox per submission). ``--nbgrader-baseline`` also times plain
``nbgrader autograde`` of the same class in one process, to show what the sandbox costs.

Target: close to ``jobs``x on a machine with ``jobs`` idle cores (each autograde is one kernel
plus process start-up and waiting, so the speedup is bounded by the number of cores). Measured on
a shared 2-core VM: 297.5 s sequential, 153.2 s with 2 jobs (1.94x), plain nbgrader 207.8 s
(benchmarks/results/grading-cpu-2core.json). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpulab.course.grade import default_jobs, grade  # noqa: E402
from gpulab.course.nbgrader_cli import nbgrader  # noqa: E402
from gpulab.course.release import release  # noqa: E402
from gpulab.course.sandbox import Limits  # noqa: E402

LAB = "00_setup"


def make_class(root: Path, submissions: int) -> Path:
    """A course copy with ``submissions`` students, each handing in the source notebook."""
    shutil.copytree(REPO / "notebooks" / "source", root / "source")
    shutil.copy(REPO / "notebooks" / "nbgrader_config.py", root / "nbgrader_config.py")
    release(root, LAB)
    for i in range(submissions):
        shutil.copytree(root / "source" / LAB, root / "submitted" / f"student_{i:03d}" / LAB)
    return root


def timed_grade(course: Path, jobs: int) -> tuple[float, bool]:
    t0 = time.perf_counter()
    rows = grade(course, LAB, jobs=jobs, limits=Limits(memory_mb=2048), progress=False)
    seconds = time.perf_counter() - t0
    return seconds, all(r.score == r.max_score > 0 and not r.notes for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--submissions", type=int, default=20)
    p.add_argument("--jobs", type=int, default=default_jobs())
    p.add_argument("--nbgrader-baseline", action="store_true", help="also time plain sequential nbgrader autograde")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-") as tmp:
        course = make_class(Path(tmp), args.submissions)
        sequential_s, ok_seq = timed_grade(course, 1)
        parallel_s, ok_par = timed_grade(course, args.jobs)
        out = {
            "benchmark": "grading", "lab": LAB, "submissions": args.submissions, "jobs": args.jobs,
            "cores": default_jobs(), "machine": platform.machine(), "device": "cpu",
            "sequential_s": round(sequential_s, 1), "parallel_s": round(parallel_s, 1),
            "speedup": round(sequential_s / parallel_s, 2),
            "sequential_s_per_submission": round(sequential_s / args.submissions, 2),
            "all_full_marks": ok_seq and ok_par,
        }
        if args.nbgrader_baseline:
            t0 = time.perf_counter()
            proc = nbgrader(course, "autograde", LAB, "--force")
            out["nbgrader_sequential_s"] = round(time.perf_counter() - t0, 1)
            out["sandbox_overhead"] = round(sequential_s / out["nbgrader_sequential_s"], 2)
            out["nbgrader_ok"] = proc.returncode == 0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
