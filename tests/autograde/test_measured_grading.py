"""Measured verdicts that neither the student's kernel nor the machine's load can bend, graded end to
end on a small lab of their own.

The probe lab has a value check whose hidden test names no expected value (``fast_sum``: the
reference run's solution gives it) and a measured check, ``overlapped``: four steps, each a 50 ms
stalling read and 50 ms of device work (both modelled time: sleeps), that must run in at most
320 ms (the reads overlapped with the device: about 250 ms; one after another: 400 ms), and no
faster than the 200 ms the device needs.
Beside an honest classmate, submissions that: run the steps one after another, skip the device's
wait (faster than the floor), answer from a cache (the result is compared with the reference's for
a seed revealed only in the request), reply before the work is done (the result arrives late), and
spin every core they are given (their own runs may pay for it; the honest classmate graded beside
them gets full marks, as it does graded alone).
"""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest
from conftest import COURSE, REPO

from gpulab.autograde.limits import Limits
from gpulab.autograde.run import grade
from gpulab.confine import isolation
from gpulab.course.release import release

pytestmark = [pytest.mark.notebook]
LAB = "99_probe"
SETUP = '''import threading, time
import torch
from gpulab import grading
from gpulab.grading.exercises import require

READ_S, DEVICE_S, STEPS = 0.05, 0.05, 4


def read_batch(seed, i):
    """A stalling read: 50 ms of waiting for storage, then the batch."""
    time.sleep(READ_S)
    return (seed * 31 + i) % 1000


def device_step(batch):
    """The simulated device: 50 ms of work the host has to wait for."""
    time.sleep(DEVICE_S)
    return batch % 97'''
FAST_SUM = '''def fast_sum(n, seed):
    """The sum of n seeded uniform numbers (torch.rand, float64)."""
    ### BEGIN SOLUTION
    g = torch.Generator().manual_seed(seed)
    return float(torch.rand(n, generator=g, dtype=torch.float64).sum())
    ### END SOLUTION'''
FAST_TEST = '''"""fast_sum gives the sum."""
require(globals(), "fast_sum")
grading.check_close(fast_sum(3, 0), 2.1373, what="fast_sum(3, 0)", rtol=1e-3)
### BEGIN HIDDEN TESTS
r = grading.rng("sum")
n, s = r.randint(100, 5000), r.randrange(10**6)
grading.check_close(fast_sum(n, s), what=f"fast_sum({n}, {s})", rtol=1e-9)
### END HIDDEN TESTS'''
OVERLAP = '''def overlapped(seed):
    """STEPS steps of device_step(read_batch(seed, i)), the next read overlapped with the device."""
    ### BEGIN SOLUTION
    out, nxt = [], {}
    def fetch(i):
        nxt[i] = read_batch(seed, i)
    t = threading.Thread(target=fetch, args=(0,)); t.start()
    for i in range(STEPS):
        t.join()
        batch = nxt.pop(i)
        if i + 1 < STEPS:
            t = threading.Thread(target=fetch, args=(i + 1,)); t.start()
        out.append(device_step(batch))
    return out
    ### END SOLUTION'''
OVERLAP_TEST = '''"""overlapped hides the reads behind the device: at most 320 ms for 200 ms of device work (400 ms one after another)."""
require(globals(), "overlapped")
grading.check_equal(overlapped(1), [device_step(read_batch(1, i)) for i in range(STEPS)], what="the steps' results")
grading.check_measured(overlapped, rule="measure.wall", what="four steps, reads overlapped",
                       floor_s=STEPS * DEVICE_S, at_most_s=0.32, why="a read is not overlapped with the device")
### BEGIN HIDDEN TESTS
s = grading.rng("overlap").randrange(10**6)
grading.check_equal(overlapped(s), what="the steps' results on another seed")
### END HIDDEN TESTS'''

SERIAL = '''def overlapped(seed):  # right results, one read after another: 400 ms
    return [device_step(read_batch(seed, i)) for i in range(STEPS)]
'''
SKIP_DEVICE = OVERLAP.replace("### BEGIN SOLUTION", "time.sleep = lambda seconds: None  # the waits, gone")
CACHED = '''_cache = {}
def overlapped(seed):  # right on the visible seed, a remembered answer on the grader's
    if seed == 1:
        return [device_step(read_batch(1, i)) for i in range(STEPS)]
    time.sleep(STEPS * DEVICE_S)
    return _cache.setdefault("x", [0] * STEPS)
'''
REPLY_EARLY = '''import threading as _th
_shell = get_ipython()
_run, _run_async = _shell.run_cell, _shell.run_cell_async
def _early(raw_cell, *a, **k):
    if "run_measured" in raw_cell:  # the grader's request: reply at once, work in the background
        _th.Thread(target=_run, args=(raw_cell,), daemon=True).start()
        return _run("None")
    return _run(raw_cell, *a, **k)
async def _early_async(raw_cell, *a, **k):
    if "run_measured" in raw_cell:
        _th.Thread(target=_run, args=(raw_cell,), daemon=True).start()
        return await _run_async("None")
    return await _run_async(raw_cell, *a, **k)
_shell.run_cell, _shell.run_cell_async = _early, _early_async
''' + SERIAL
SPINNER = '''import subprocess, sys
_busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]  # its own CPUs, kept busy
''' + OVERLAP

CLASS = {  # student: (fast_sum answer, overlapped answer, the score it must get, what its verdict says)
    "honest": (None, None, 4, None),
    "serial": (None, SERIAL, 2, "a read is not overlapped with the device"),
    "skip_device": (None, SKIP_DEVICE, 2, "the work was not done as written"),
    "cached_results": (None, CACHED, 2, "did not give the reference's result"),
    "reply_early": (None, REPLY_EARLY, 2, "0 results instead of one"),
    "spinner": (None, SPINNER, None, None),  # its own cores kept busy: its own runs may pay, nobody else's
    "wrong_sum": ("def fast_sum(n, seed):\n    return float(n) / 2\n", None, 2, "fast_sum("),
}


def _notebook() -> nbformat.NotebookNode:
    import sys

    sys.path.insert(0, str(REPO / "tools"))
    from nbauthor import code, solution, tests

    nb = nbformat.v4.new_notebook()
    nb.cells = [code(SETUP), solution(FAST_SUM, "fast_sum_impl"), tests(FAST_TEST, "fast_sum_sums", points=2),
                solution(OVERLAP, "overlapped_impl"), tests(OVERLAP_TEST, "overlapped_overlaps", points=2)]
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}}
    return nb


def _course(root, students: dict) -> object:
    shutil.copy(COURSE / "nbgrader_config.py", root / "nbgrader_config.py")
    (root / "source" / LAB).mkdir(parents=True)
    shutil.copy(COURSE / "source" / "header.ipynb", root / "source" / "header.ipynb")
    nbformat.write(_notebook(), str(root / "source" / LAB / f"{LAB}.ipynb"))
    release(root, LAB)
    for student, (fast, overlap, _, _) in students.items():
        folder = root / "submitted" / student / LAB
        folder.mkdir(parents=True)
        nb = nbformat.read(str(root / "release" / LAB / f"{LAB}.ipynb"), as_version=4)
        answers = {"fast_sum_impl": fast or FAST_SUM, "overlapped_impl": overlap or OVERLAP}
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in answers:
                cell.source = re.sub(r"\n?\s*### (BEGIN|END) SOLUTION", "", answers[gid])
        nbformat.write(nb, str(folder / f"{LAB}.ipynb"))
    return root


def _grade(root) -> dict:
    plan = isolation.detect()
    limits = Limits(wall_s=300, cell_timeout_s=60, memory_mb=1536, allow_weaker=bool(plan.off()))
    return {r.student: r for r in grade(root, LAB, jobs=2, limits=limits, progress=False, plan=plan)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory):
    root = _course(tmp_path_factory.mktemp("probe"), CLASS)
    return root, _grade(root)


@pytest.mark.timeout(900)
def test_each_submission_scores_what_its_work_earns_once(graded) -> None:
    """One grading, no retry: the honest notebooks get full marks, each trick loses the measured cell."""
    _, rows = graded
    for student, (_, _, score, note) in CLASS.items():
        if score is not None:
            assert rows[student].score == score, (student, rows[student].score, rows[student].notes)
    root, _ = graded
    for student, (_, _, _, note) in CLASS.items():
        if note:
            nb = nbformat.read(str(root / "autograded" / student / LAB / f"{LAB}.ipynb"), as_version=4)
            errors = "".join(o.get("evalue", "") for c in nb.cells for o in c.get("outputs", [])
                             if o.get("output_type") == "error")
            assert note in errors, (student, errors)


def test_the_figures_come_from_the_graders_side(graded) -> None:
    root, _ = graded
    nb = nbformat.read(str(root / "autograded" / "honest" / LAB / f"{LAB}.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "overlapped_overlaps")
    shown = "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs if o.output_type == "display_data")
    assert "measured by the grader" in shown and " ms" in shown, shown


@pytest.mark.timeout(600)
def test_the_honest_score_does_not_move_when_graded_alone(tmp_path) -> None:
    """The honest notebook graded alone, with nobody beside it, gets the score it got in the busy class."""
    root = _course(tmp_path, {"honest": CLASS["honest"]})
    assert _grade(root)["honest"].score == 4
