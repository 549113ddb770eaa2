"""What the grading sandbox costs over plain nbgrader, and what parallel grading gains: the same
class of lab 00 submissions graded by ``gpulab.course.grade`` with one worker and by plain
``nbgrader autograde`` in one process, in alternating rounds of one run.

    flock /tmp/gpulab-cpu.lock .venv/bin/python benchmarks/grading.py [--submissions 10] [--rounds 2]
        [--parallel]

Every submission is the lab's source notebook (full marks). The sandbox grades each one in a
grading copy of its own, with nbgrader started once per submission, under the OS isolation of
``gpulab.course.isolation`` (namespaces, cgroup, the kernel's own uid, Landlock) and the
in-kernel probes; plain nbgrader starts once for the whole class and runs every kernel as the
grader. Rounds alternate (sandbox, plain, sandbox, plain...) so that a change in the machine's
load falls on both. ``sandbox_overhead`` is the sandbox's total time over plain nbgrader's.
``--parallel`` also grades the class with one worker per core (``speedup`` over one worker).
Wall-clock time on a shared machine moves with the neighbours' load, so the CPU time of the
grader and every process it waited for (nbgrader, kernels) is reported beside it.

Target: ``sandbox_overhead`` (and ``sandbox_cpu_overhead``) <= 1.2. Recorded runs: benchmarks/results/grading-*.json. Prints
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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


def cpu_seconds() -> float:
    """CPU time of this process and of every child it has waited for (nbgrader, kernels, ...)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed_grade(course: Path, jobs: int) -> tuple[float, float, list[str]]:
    """Wall and CPU seconds to grade the class, and the rows that did not get full marks without a note."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    rows = grade(course, LAB, jobs=jobs, limits=Limits(memory_mb=2048), progress=False)
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return seconds, cpu, [f"{r.student}: {r.score:g}/{r.max_score:g} {r.notes}" for r in rows
                          if not (r.score == r.max_score > 0 and not r.notes)]


def timed_nbgrader(course: Path) -> tuple[float, float, bool]:
    t0, c0 = time.perf_counter(), cpu_seconds()
    proc = nbgrader(course, "autograde", LAB, "--force")
    return time.perf_counter() - t0, cpu_seconds() - c0, proc.returncode == 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--submissions", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2, help="sandbox/plain rounds, alternating")
    p.add_argument("--parallel", action="store_true", help="also grade with one worker per core")
    p.add_argument("--jobs", type=int, default=default_jobs())
    args = p.parse_args()
    sandbox, plain, sandbox_cpu, plain_cpu, bad, plain_ok = [], [], [], [], [], True
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-") as tmp:
        course = make_class(Path(tmp), args.submissions)
        for _ in range(args.rounds):
            seconds, cpu, wrong = timed_grade(course, 1)
            sandbox.append(seconds)
            sandbox_cpu.append(cpu)
            bad += wrong
            seconds, cpu, ok = timed_nbgrader(course)
            plain.append(seconds)
            plain_cpu.append(cpu)
            plain_ok &= ok
        n = args.submissions * args.rounds
        out = {
            "benchmark": "grading", "lab": LAB, "submissions": args.submissions, "rounds": args.rounds,
            "cores": default_jobs(), "machine": platform.machine(), "device": "cpu",
            "sandbox_s": [round(s, 1) for s in sandbox], "nbgrader_s": [round(s, 1) for s in plain],
            "sandbox_s_per_submission": round(sum(sandbox) / n, 2),
            "nbgrader_s_per_submission": round(sum(plain) / n, 2),
            "sandbox_overhead": round(sum(sandbox) / sum(plain), 2),
            # CPU time barely depends on what else the machine runs: the steadier figure on a shared machine
            "sandbox_cpu_s_per_submission": round(sum(sandbox_cpu) / n, 2),
            "nbgrader_cpu_s_per_submission": round(sum(plain_cpu) / n, 2),
            "sandbox_cpu_overhead": round(sum(sandbox_cpu) / sum(plain_cpu), 2),
            "load_avg_1min": round(os.getloadavg()[0], 1),
            "all_full_marks": not bad, "nbgrader_ok": plain_ok,
        }
        if bad:
            out["not_full"] = bad[:5]
        if args.parallel:
            parallel_s, _, wrong = timed_grade(course, args.jobs)
            out.update(jobs=args.jobs, parallel_s=round(parallel_s, 1),
                       speedup=round(sandbox[-1] / parallel_s, 2), all_full_marks=not bad and not wrong)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
