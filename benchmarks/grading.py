"""What the grader costs over plain nbgrader (and over an earlier grader), and what parallel grading
gains: the same class of submissions graded by ``gpulab.autograde.run`` and by plain ``nbgrader
autograde`` in one process, in alternating rounds of one run.

    flock /tmp/gpulab-cpu.lock .venv/bin/python benchmarks/grading.py [--lab 00_setup] [--submissions 10]
        [--rounds 2] [--jobs 1] [--parallel] [--old /path/to/an/earlier/checkout]

``--old`` also grades a class of the same size with the grader of another checkout (a ``git worktree``
of an earlier commit: its ``gpulab`` is put first on ``PYTHONPATH``, in the same environment; its
students hand in that checkout's source notebook, whose hidden tests call its own graders), in the same
alternating rounds: ``vs_old`` is this grader's time over that one's. The verdicts issue's targets:
lab 00 with one worker at most 1.3x plain nbgrader; 30 lab-06 submissions at 2 jobs within 1.2x
of the grader before it (``--lab 06_ddp --submissions 30 --jobs 2 --old ...``).

Every submission is the lab's source notebook (full marks). The grader runs the lab's reference
run once, then grades each submission in a grading copy of its own, with nbgrader started once per
submission, under the OS isolation of ``gpulab.confine.isolation`` (namespaces, cgroup, the
kernel's own uid, Landlock), judged against the reference run; plain nbgrader starts once for the
whole class and runs every kernel as the grader, deciding in the kernel. Rounds alternate (sandbox, plain, sandbox, plain...) so that a change in the machine's
load falls on both. ``sandbox_overhead`` is the sandbox's total time over plain nbgrader's.
``--parallel`` also grades the class with one worker per core (``speedup`` over one worker).
``--ray`` also grades it on a local Ray cluster of this machine's cores (``make grade RAY_ADDRESS=``'s
path, the cluster's start included): ``ray_vs_pool`` is its time over the worker pool's at as many jobs.
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpulab.autograde.limits import Limits  # noqa: E402
from gpulab.autograde.nbgrader import nbgrader  # noqa: E402
from gpulab.autograde.plan import default_jobs  # noqa: E402
from gpulab.autograde.run import grade  # noqa: E402
from gpulab.course.release import release  # noqa: E402

LAB = "00_setup"
OLD_DRIVER = """
import json, sys, time
from gpulab.autograde.run import grade
from gpulab.autograde.limits import Limits
t0 = time.perf_counter()
rows = grade(sys.argv[1], sys.argv[2], jobs=int(sys.argv[3]), limits=Limits(memory_mb=2048), progress=False)
print(json.dumps({"seconds": time.perf_counter() - t0, "scores": [r.score for r in rows]}))
"""


def make_class(root: Path, submissions: int, lab: str = LAB, repo: Path = REPO) -> Path:
    """A course copy of ``repo``'s labs with ``submissions`` students, each handing in the source notebook."""
    shutil.copytree(repo / "notebooks" / "source", root / "source")
    shutil.copy(repo / "notebooks" / "nbgrader_config.py", root / "nbgrader_config.py")
    release(root, lab)
    for i in range(submissions):
        shutil.copytree(root / "source" / lab, root / "submitted" / f"student_{i:03d}" / lab)
    return root


def cpu_seconds() -> float:
    """CPU time of this process and of every child it has waited for (nbgrader, kernels, ...)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed_grade(course: Path, jobs: int, lab: str = LAB) -> tuple[float, float, list[float]]:
    """Wall and CPU seconds to grade the class, and every row's score."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    rows = grade(course, lab, jobs=jobs, limits=Limits(memory_mb=2048), progress=False)
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return seconds, cpu, [r.score for r in rows]


def timed_old(course: Path, jobs: int, lab: str, checkout: Path) -> tuple[float, float, list[float]]:
    """The same, with the grader of ``checkout`` (run in a child process)."""
    c0 = cpu_seconds()
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.run([sys.executable, "-c", OLD_DRIVER, str(course), lab, str(jobs)], env=env, capture_output=True,
                          text=True, cwd=checkout)
    if proc.returncode != 0:
        raise RuntimeError(f"the grader of {checkout} failed:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["seconds"], cpu_seconds() - c0, out["scores"]


def timed_ray(course: Path, lab: str = LAB) -> tuple[float, list[float]]:
    """Wall seconds to start a one-node Ray cluster of this machine's cores and grade the class on it."""
    from ray.cluster_utils import Cluster

    from gpulab.autograde.runners.ray import WHOLE_NODE

    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": default_jobs(), "include_dashboard": False,
                                                            "resources": {WHOLE_NODE: 1}})
    try:
        rows = grade(course, lab, jobs=default_jobs(), limits=Limits(memory_mb=2048), progress=False,
                     ray_address=cluster.address)
    finally:
        cluster.shutdown()
    return time.perf_counter() - t0, [r.score for r in rows]


def timed_nbgrader(course: Path, lab: str = LAB) -> tuple[float, float, bool]:
    t0, c0 = time.perf_counter(), cpu_seconds()
    proc = nbgrader(course, "autograde", lab, "--force")
    return time.perf_counter() - t0, cpu_seconds() - c0, proc.returncode == 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lab", default=LAB)
    p.add_argument("--submissions", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2, help="grader/plain(/old) rounds, alternating")
    p.add_argument("--jobs", type=int, default=1, help="workers of the grader (and of --old's)")
    p.add_argument("--parallel", action="store_true", help="also grade with one worker per core")
    p.add_argument("--old", default=None, help="an earlier checkout whose grader is timed beside this one")
    p.add_argument("--no-plain", action="store_true", help="skip plain nbgrader")
    p.add_argument("--ray", action="store_true", help="also grade on a local Ray cluster, beside the pool at as many jobs")
    args = p.parse_args()
    new, new_cpu, plain, plain_cpu, old, old_cpu, plain_ok = [], [], [], [], [], [], True
    scores, old_scores = [], []
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-") as tmp:
        course = make_class(Path(tmp) / "class", args.submissions, args.lab)
        # the earlier grader grades the earlier lab (its hidden tests call its own gpulab.grading)
        old_course = make_class(Path(tmp) / "old", args.submissions, args.lab, Path(args.old)) if args.old else None
        for _ in range(args.rounds):
            seconds, cpu, got = timed_grade(course, args.jobs, args.lab)
            new.append(seconds)
            new_cpu.append(cpu)
            scores = got
            if args.old:
                seconds, cpu, got = timed_old(old_course, args.jobs, args.lab, Path(args.old))
                old.append(seconds)
                old_cpu.append(cpu)
                old_scores = got
            if not args.no_plain:
                seconds, cpu, ok = timed_nbgrader(course, args.lab)
                plain.append(seconds)
                plain_cpu.append(cpu)
                plain_ok &= ok
        n = args.submissions * args.rounds
        out = {
            "benchmark": "grading", "lab": args.lab, "submissions": args.submissions, "rounds": args.rounds,
            "jobs": args.jobs, "cores": default_jobs(), "machine": platform.machine(), "device": "cpu",
            "grader_s": [round(s, 1) for s in new], "grader_s_per_submission": round(sum(new) / n, 2),
            "grader_cpu_s_per_submission": round(sum(new_cpu) / n, 2),
            "load_avg_1min": round(os.getloadavg()[0], 1), "scores": sorted(set(scores)),
        }
        if plain:
            out.update(nbgrader_s=[round(s, 1) for s in plain], nbgrader_s_per_submission=round(sum(plain) / n, 2),
                       sandbox_overhead=round(sum(new) / sum(plain), 2),
                       # CPU time barely depends on what else the machine runs: the steadier figure
                       sandbox_cpu_overhead=round(sum(new_cpu) / sum(plain_cpu), 2), nbgrader_ok=plain_ok)
        if old:
            out.update(old_s=[round(s, 1) for s in old], vs_old=round(sum(new) / sum(old), 2),
                       vs_old_cpu=round(sum(new_cpu) / sum(old_cpu), 2), old_scores=sorted(set(old_scores)))
        if args.parallel:
            parallel_s, _, _ = timed_grade(course, default_jobs(), args.lab)
            out.update(parallel_jobs=default_jobs(), parallel_s=round(parallel_s, 1),
                       speedup=round(new[-1] / parallel_s, 2))
        if args.ray:
            pool_s, ray_s = [], []
            for _ in range(args.rounds):  # alternating, as above
                pool_s.append(timed_grade(course, default_jobs(), args.lab)[0])
                seconds, ray_scores = timed_ray(course, args.lab)
                ray_s.append(seconds)
            out.update(pool_s=[round(x, 1) for x in pool_s], ray_local_s=[round(x, 1) for x in ray_s],
                       ray_vs_pool=round(sum(ray_s) / sum(pool_s), 2), ray_scores=sorted(set(ray_scores)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
