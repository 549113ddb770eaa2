"""A grade that depends on the work alone (issue 48): the same class graded alone, beside a classmate
spinning every core, and beside another lab's class graded at the same time, must score the same.

    /work/bin/heavy .venv/bin/python benchmarks/grading_fairness.py [--labs 01_bottleneck,03_hdf5] [--copies 5]

For every lab named (default: each lab that had a wall-clock verdict and has its variants below),
one class holds ``--copies`` copies of the source answers (honest), a correct but naive submission
(the lesson's fix left out: the sync kept, the whole file read) and a wrong but fast one (the fix
made, the result wrong). It is graded under three conditions, in one run:

- ``alone``: ``JOBS=1``, nothing else running;
- ``spinner``: ``JOBS=2``, beside a process spinning every core of the machine;
- ``two_classes``: ``JOBS=1``, beside a second class (lab 00's source answers) graded at the same time.

The figure is, for each kind (honest, naive, wrong) in each condition, the fraction of gradings
whose score equals that submission's score alone: target **1.00** everywhere. Each condition's run
time is reported beside it. Prints one JSON line; recorded runs go to
``benchmarks/results/grading_fairness-<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
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

# lab -> kind -> [(answer cell's grade_id, text in the source's solution, what replaces it)]
VARIANTS: dict[str, dict[str, list[tuple[str, str, str]]]] = {
    "01_bottleneck": {
        "naive": [("step_no_sync_impl", "running_loss = running_loss + loss  # stays on the device: no sync",
                   "running_loss = running_loss + loss.item()  # a sync every step")],
        "wrong": [("step_no_sync_impl", "running_loss = running_loss + loss  # stays on the device: no sync",
                   "running_loss = running_loss + 2 * loss  # fast, but not the sum")],
    },
}
SIDE_LAB = "00_setup"  # the second class of the two_classes condition


def _variant(source: Path, changes: list[tuple[str, str, str]], out: Path) -> None:
    nb = nbformat.read(str(source), as_version=4)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    for gid, old, new in changes:
        if gid not in cells or old not in cells[gid].source:
            raise SystemExit(f"{source.name}: cell {gid!r} no longer holds {old!r}; update VARIANTS in {__file__}")
        cells[gid].source = cells[gid].source.replace(old, new)
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))


def make_class(root: Path, lab: str, copies: int, variants: dict[str, list]) -> dict[str, str]:
    """A course root with the lab's class; returns student -> kind."""
    shutil.copytree(REPO / "notebooks" / "source", root / "source")
    shutil.copy(REPO / "notebooks" / "nbgrader_config.py", root / "nbgrader_config.py")
    release(root, lab)
    kinds = {}
    for i in range(copies):
        shutil.copytree(root / "source" / lab, root / "submitted" / f"honest_{i}" / lab)
        kinds[f"honest_{i}"] = "honest"
    for kind, changes in variants.items():
        shutil.copytree(root / "source" / lab, root / "submitted" / kind / lab)
        _variant(root / "source" / lab / f"{lab}.ipynb", changes, root / "submitted" / kind / lab / f"{lab}.ipynb")
        kinds[kind] = kind
    return kinds


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _grade(course: Path, lab: str, jobs: int) -> tuple[dict[str, float], float]:
    limits = Limits(memory_mb=2048, allow_weaker=bool(isolation.detect().off()))
    t0 = time.perf_counter()
    rows = grade(course, lab, jobs=jobs, limits=limits, progress=False, fresh=True)
    return {r.student: r.score for r in rows}, time.perf_counter() - t0


def run_lab(tmp: Path, lab: str, copies: int) -> dict:
    course = tmp / lab
    kinds = make_class(course, lab, copies, VARIANTS[lab])
    out: dict = {"students": len(kinds)}
    alone, out["alone_s"] = _grade(course, lab, 1)
    out["alone_scores"] = {k: sorted({alone[s] for s, kk in kinds.items() if kk == k}) for k in set(kinds.values())}

    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for p in spinners:
        p.start()
    try:
        spun, out["spinner_s"] = _grade(course, lab, 2)
    finally:
        stop.set()
        for p in spinners:
            p.join()

    side = tmp / f"{lab}-side"
    shutil.copytree(REPO / "notebooks" / "source", side / "source")
    shutil.copy(REPO / "notebooks" / "nbgrader_config.py", side / "nbgrader_config.py")
    release(side, SIDE_LAB)
    for i in range(copies):
        shutil.copytree(side / "source" / SIDE_LAB, side / "submitted" / f"side_{i}" / SIDE_LAB)
    cmd = [sys.executable, "-m", "gpulab.autograde", "--course", str(side), "--lab", SIDE_LAB, "--jobs", "1",
           "--memory-mb", "2048", "--quiet"] + (["--allow-weaker-sandbox"] if isolation.detect().off() else [])
    beside = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a grader of its own
    try:
        two, out["two_classes_s"] = _grade(course, lab, 1)
    finally:
        out["side_class_rc"] = beside.wait()

    for name, scores in (("spinner", spun), ("two_classes", two)):
        for kind in sorted(set(kinds.values())):
            mine = [s for s, k in kinds.items() if k == kind]
            out[f"{name}_{kind}_same"] = sum(scores[s] == alone[s] for s in mine) / len(mine)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--labs", default=",".join(VARIANTS), help="labs to grade (comma-separated)")
    p.add_argument("--copies", type=int, default=5, help="copies of the source answers in each class")
    args = p.parse_args()
    labs = [lab for lab in args.labs.split(",") if lab]
    unknown = [lab for lab in labs if lab not in VARIANTS]
    if unknown:
        raise SystemExit(f"no variants for {', '.join(unknown)}: the labs with some are {', '.join(VARIANTS)}")
    result: dict = {"benchmark": "grading_fairness", "machine": f"{platform.machine()} {os.cpu_count()} cores",
                    "copies": args.copies}
    with tempfile.TemporaryDirectory(prefix="gpulab-fairness-") as tmp:
        for lab in labs:
            print(f"grading {lab} under three conditions ...", file=sys.stderr, flush=True)
            result[lab] = run_lab(Path(tmp), lab, args.copies)
    same = [v for lab in labs for k, v in result[lab].items() if k.endswith("_same")]
    result["all_same"] = min(same) if same else None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
