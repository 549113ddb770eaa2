"""A grade that depends on the work alone (issue 48): the same class graded alone, beside a load that
spins every core, and beside another lab's class graded at the same time, must score the same.

    /work/bin/heavy .venv/bin/python benchmarks/grading_fairness.py [--labs 01_bottleneck,03_hdf5] [--copies 5]

For every lab named (default: each lab that had a wall-clock verdict: 01, 02, 03, 06, 07, 10, 12),
one class holds ``--copies`` copies of the source answers (``source``), a correct but naive
submission (``naive``: the lesson's fix left out, so it loses the points of that lesson) and a wrong
but fast one (``wrong``: the fix made, the result wrong, so it loses the correctness points). The
two variants are the source notebook with some solution lines replaced (:data:`VARIANTS`). The class
is graded under three conditions, one after the other in one run, with the same grading seed:

- ``alone``: ``JOBS=1``, nothing else started by the benchmark;
- ``spinner``: ``JOBS=2``, beside a classmate (a submission of the class: the source answers with a
  first cell that starts a busy process on every core) spinning through the whole grading, or with
  ``--spinner process`` beside one busy process per core started by the benchmark, outside the grader;
- ``two_classes``: ``JOBS=1``, beside a second grader (its own process) that grades a class of lab
  00's source answers again and again until this class is graded.

The figure is, for each kind in each condition, the fraction of its gradings whose score equals that
submission's score alone: target **1.00** everywhere. Each condition's run time is reported beside
it, with the machine's load as it starts (other sessions' work is not stopped: ``alone`` is alone only
among what the benchmark starts), and the scores alone (``alone_scores``: the distinct scores of each
kind's copies; a class whose reference run failed its own tests is ``not graded``). Prints one
JSON line; recorded runs go to ``benchmarks/results/grading_fairness-<device>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpulab.autograde.limits import Limits  # noqa: E402
from gpulab.autograde.plan import default_memory_mb  # noqa: E402
from gpulab.autograde.run import grade  # noqa: E402
from gpulab.confine import isolation  # noqa: E402
from gpulab.course.release import release  # noqa: E402

SERIAL_T0 = "    t0 = time.perf_counter()\n"  # lab 07: where the naive lock goes
# lab -> kind -> [(solution cell's grade_id, text of the source's solution, what replaces it)]
VARIANTS: dict[str, dict[str, list[tuple[str, str, str]]]] = {
    # naive: a .item() every step (the sync kept); wrong: twice the loss, and the batch fetched outside "data"
    "01_bottleneck": {
        "naive": [("step_no_sync_impl", "running_loss = running_loss + loss  # stays on the device: no sync",
                   "running_loss = running_loss + loss.item()  # a sync every step")],
        "wrong": [("step_no_sync_impl", "running_loss = running_loss + loss  # stays on the device: no sync",
                   "running_loss = running_loss + 2 * loss  # fast, but not the sum"),
                  ("profile_phases_impl", '            with record_function("data"):\n                batch = next(it)',
                   '            batch = next(it)  # fetched outside the range: the wait is not in "data"\n'
                   '            with record_function("data"):\n                pass')],
    },
    # naive: new workers every epoch, decoding on every access; wrong: the images not normalised
    "02_pipeline": {
        "naive": [("sweep_workers_impl", "persistent_workers=k > 0)", "persistent_workers=False)  # new workers every epoch"),
                  ("make_pipeline_impl", "cache = DecodedCache(dataset)", "cache = dataset  # decoded on every access")],
        "wrong": [("make_pipeline_impl", "to_device_normalize(images, setup.mean, setup.std, accel.torch_device)",
                   "images.to(accel.torch_device).float() / 255")],
    },
    # naive: 64-image chunks, a global shuffle; wrong: a cache of non-prime slots, the short last chunk dropped
    "03_hdf5": {
        "naive": [("choose_storage_impl", "rows = min(num_samples, max(1, -(-10 * 1024 // sample_nbytes)))",
                   "rows = min(num_samples, 64)  # 64-image chunks, as in section 1"),
                  ("chunk_shuffle_impl", "        for c in torch.randperm(num_chunks, generator=g).tolist():",
                   "        yield from torch.randperm(self.num_samples, generator=g).tolist()  # a global shuffle\n"
                   "        return\n        for c in torch.randperm(num_chunks, generator=g).tolist():")],
        "wrong": [("choose_storage_impl", "nslots = 100 * in_cache + 1", "nslots = 100 * in_cache"),
                  ("choose_storage_impl", "        nslots += 1  # a prime", "        break  # no prime\n        nslots += 1  # a prime"),
                  ("chunk_shuffle_impl", "size = min(self.chunk_size, self.num_samples - start)", "size = self.chunk_size"),
                  ("chunk_shuffle_impl", "num_chunks = -(-self.num_samples // self.chunk_size)",
                   "num_chunks = self.num_samples // self.chunk_size  # the short last chunk is dropped")],
    },
    # naive: a bucket per parameter (an all-reduce each); wrong: the sum over ranks, not the average
    "06_ddp": {
        "naive": [("bucketed_ddp_impl", "for indices in assign_buckets(self.params, bucket_size_mb):",
                   "for indices in [[i] for i in reversed(range(len(self.params)))]:  # a bucket per parameter")],
        "wrong": [("bucketed_ddp_impl", '            bucket["buffer"].div_(self.world_size)\n', "")],
    },
    # naive: one stage at a time (a lock around each pass); wrong: the micro-batches' losses not weighted
    "07_model_parallel": {
        "naive": [("pipelined_train_step_impl", SERIAL_T0, SERIAL_T0 + "    serial = threading.Lock()  # one stage at a time\n"),
                  ("pipelined_train_step_impl", "                    out = stages[i](comm.to(h, devices[i]))",
                   "                    with serial:\n                        out = stages[i](comm.to(h, devices[i]))"),
                  ("pipelined_train_step_impl", "                    torch.autograd.backward(out, g)  #",
                   "                    with serial:\n                        torch.autograd.backward(out, g)  #")],
        "wrong": [("pipelined_train_step_impl", " * (xs[j].size(0) / rows)", "  # not weighted by the micro-batch's rows")],
    },
    # naive: a whole core per trial (no packing); wrong: the GPUs forgotten
    "10_search": {
        "naive": [("packed_resources_impl", '        return {"cpu": 1 / trials_per_device}', '        return {"cpu": 1.0}  # a core per trial')],
        "wrong": [("packed_resources_impl", '    if num_gpus == 0:\n', '    if True:  # the GPUs forgotten\n')],
    },
    # naive: the clip limit read back to the host (a graph break); wrong: the clip at 0.8, not 0.9
    "12_launch_bound": {
        "naive": [("nobreak_impl", "limit = x.abs().amax() * 0.9", "limit = x.abs().amax().item() * 0.9  # a host sync")],
        "wrong": [("nobreak_impl", "limit = x.abs().amax() * 0.9", "limit = x.abs().amax() * 0.8")],
    },
}
VARIANTS_KINDS = ("naive", "wrong")
# the spinner classmate's first cell (as tests/grading_timed_class.py's): a busy process per core, each
# trying to widen its CPU affinity to every core, spinning until its kernel ends
SPINNER = """import multiprocessing as _mp, os as _os
def _spin():
    try:
        _os.sched_setaffinity(0, range(_os.cpu_count()))
    except OSError:
        pass
    while True:
        pass
_spinners = [_mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(_os.cpu_count() or 2)]
for _p in _spinners:
    _p.start()
"""
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


def _course(root: Path, lab: str) -> None:
    shutil.copytree(REPO / "notebooks" / "source", root / "source")
    shutil.copy(REPO / "notebooks" / "nbgrader_config.py", root / "nbgrader_config.py")
    release(root, lab)


def make_class(root: Path, lab: str, copies: int) -> dict[str, str]:
    """A course root with the lab's class; returns student -> kind (source, naive, wrong)."""
    _course(root, lab)
    kinds = {}
    for i in range(copies):
        shutil.copytree(root / "source" / lab, root / "submitted" / f"source_{i}" / lab)
        kinds[f"source_{i}"] = "source"
    for kind, changes in VARIANTS[lab].items():
        shutil.copytree(root / "source" / lab, root / "submitted" / kind / lab)
        _variant(root / "source" / lab / f"{lab}.ipynb", changes, root / "submitted" / kind / lab / f"{lab}.ipynb")
        kinds[kind] = kind
    return kinds


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _grade(course: Path, lab: str, jobs: int, seed: int, out: dict, name: str) -> dict[str, float | None]:
    """Each student's score (None where the class was not graded: the reference run failed its own
    tests); the run time and any refusal go to ``out``."""
    limits = Limits(memory_mb=default_memory_mb(jobs), allow_weaker=bool(isolation.detect().off()))
    out[f"{name}_load_before"] = round(os.getloadavg()[0], 1)  # the machine's 1-minute load as the condition starts
    t0 = time.perf_counter()
    rows = grade(course, lab, jobs=jobs, limits=limits, progress=False, fresh=True, seed=seed)
    out[f"{name}_s"] = round(time.perf_counter() - t0, 1)
    refused = [r.notes for r in rows if r.notes.startswith("not graded")]
    if refused:
        out[f"{name}_not_graded"] = refused[0][:300]
    return {r.student: None if r.notes.startswith("not graded") else r.score for r in rows}


def _side_class(tmp: Path, copies: int, done: threading.Event, rcs: list[int]) -> None:
    """Grade a class of lab 00's source answers in a grader of its own, again and again until ``done``."""
    side = tmp / "side"
    if not side.exists():
        _course(side, SIDE_LAB)
        for i in range(copies):
            shutil.copytree(side / "source" / SIDE_LAB, side / "submitted" / f"side_{i}" / SIDE_LAB)
    cmd = [sys.executable, "-m", "gpulab.autograde", "--course", str(side), "--lab", SIDE_LAB, "--jobs", "1",
           "--fresh", "--quiet"] + (["--allow-weaker-sandbox"] if isolation.detect().off() else [])
    while not done.is_set():
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None:
            if done.wait(0.5):
                proc.terminate()  # the class beside it is graded: this round is not counted
                proc.wait()
                return
        rcs.append(proc.returncode)


def _same(scores: dict[str, float | None], alone: dict[str, float | None], kinds: dict[str, str]) -> dict[str, float]:
    """Per kind, the fraction of its gradings with the score it got alone (a class not graded, here or
    alone, scores no match: a grade that does not come is not the same grade)."""
    out = {}
    for kind in ("source", *VARIANTS_KINDS):
        mine = [s for s, k in kinds.items() if k == kind]
        out[kind] = round(sum(alone[s] is not None and scores.get(s) == alone[s] for s in mine) / len(mine), 2)
    return out



def run_lab(tmp: Path, lab: str, copies: int, seed: int, spinner: str) -> dict:
    course = tmp / lab
    kinds = make_class(course, lab, copies)
    out: dict = {"students": len(kinds)}
    alone = _grade(course, lab, 1, seed, out, "alone")
    out["alone_scores"] = {k: sorted({"not graded" if alone[s] is None else alone[s] for s, kk in kinds.items() if kk == k},
                                     key=str) for k in ("source", *VARIANTS_KINDS)}

    if spinner == "classmate":  # a submission of the class spins; its own score is not among the kinds'
        folder = course / "submitted" / "spinner" / lab
        shutil.copytree(course / "source" / lab, folder)
        nb = nbformat.read(str(folder / f"{lab}.ipynb"), as_version=4)
        nb.cells.insert(1, nbformat.v4.new_code_cell(SPINNER))
        nbformat.write(nb, str(folder / f"{lab}.ipynb"))
        spun = _grade(course, lab, 2, seed, out, "spinner")
        out["spinner_own_score"] = spun.get("spinner")
        shutil.rmtree(folder.parent)
    else:  # processes of the benchmark's, outside the grader
        stop = multiprocessing.Event()
        spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
        for p in spinners:
            p.start()
        try:
            spun = _grade(course, lab, 2, seed, out, "spinner")
        finally:
            stop.set()
            for p in spinners:
                p.join()
    out["spinner"] = _same(spun, alone, kinds)

    done, rcs = threading.Event(), []
    beside = threading.Thread(target=_side_class, args=(tmp, copies, done, rcs), daemon=True)
    beside.start()
    time.sleep(10)  # the side class's own release and reference run are under way
    try:
        two = _grade(course, lab, 1, seed, out, "two_classes")
    finally:
        done.set()
        beside.join()
    out["two_classes"] = _same(two, alone, kinds)
    out["side_classes_graded"] = len(rcs)
    out["side_class_rcs"] = sorted(set(rcs))
    return out


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" (uncommitted changes)" if git("status", "--porcelain", "-uno") else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--labs", default=",".join(VARIANTS), help="labs to grade (comma-separated; 01 for 01_bottleneck)")
    p.add_argument("--copies", type=int, default=5, help="copies of the source answers in each class")
    p.add_argument("--seed", type=int, default=4848, help="the grading seed of every condition")
    p.add_argument("--spinner", choices=("classmate", "process"), default="classmate",
                   help="who spins in the spinner condition: a submission of the class, or processes of the benchmark's")
    args = p.parse_args()
    names = [x for x in args.labs.split(",") if x]
    labs = [next((lab for lab in VARIANTS if lab == x or lab.split("_")[0] == x), x) for x in names]
    unknown = [lab for lab in labs if lab not in VARIANTS]
    if unknown:
        raise SystemExit(f"no variants for {', '.join(unknown)}: the labs with some are {', '.join(VARIANTS)}")
    if args.copies < 1:
        raise SystemExit(f"--copies {args.copies}: a class needs at least one copy of the source answers")
    result: dict = {"benchmark": "grading_fairness", "machine": f"{platform.machine()} {os.cpu_count()} cores",
                    "commit": _commit(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                    "copies": args.copies, "seed": args.seed, "spinner": args.spinner, "labs": labs}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpulab-fairness-") as tmp:
        for lab in labs:
            print(f"grading {lab} under three conditions ...", file=sys.stderr, flush=True)
            result[lab] = run_lab(Path(tmp), lab, args.copies, args.seed, args.spinner)
            print(json.dumps({lab: result[lab]}), file=sys.stderr, flush=True)
    same = [v for lab in labs for cond in ("spinner", "two_classes") for v in result[lab][cond].values()]
    result["all_same"] = min(same)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
