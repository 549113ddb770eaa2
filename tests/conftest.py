"""Shared test set-up: GPU tiers and a summary of how long each lab took in the nbgrader pipeline.

tests/ mirrors the package: the tests of gpulab/<package>/<module>.py are in
tests/<package>/test_<module>.py (the sub-folders are packages, so names may repeat across them);
the notebook pipeline tests, the layout test and the shared fixtures stay at this level.

Markers (see pyproject.toml): ``gpu`` and ``multigpu`` tests are skipped where torch cannot see
enough CUDA devices; ``notebook`` marks the slow end-to-end lab runs (``make test-fast`` skips them).

``make test`` runs the suite on two pytest-xdist workers (``TEST_WORKERS=0``: one process). Each
worker takes a scope at a time (``--dist loadfile``, with the scheduler below): a test file, except
that every lab's pipeline is a scope of its own, so the labs spread over both workers; the heaviest
scopes go first (the labs by their recorded cost, then the graded class), and the light files fill
in behind them. (xdist's ``loadgroup`` would do it with marks, but it renames ``item._nodeid``,
which pytest 9 no longer reads.) A lab's pipeline timings travel to the summary as the test's user
properties, so they are printed with or without workers.

``--shuffle SEED`` runs the collected tests in an order drawn from SEED (``make gpu-check`` runs the
GPU tests once in file order and once shuffled): a test that passes alone but fails after another
one (CUDA initialised earlier, so ranks are spawned; memory an earlier test kept) shows up.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpulab.devices import cuda_device_count

REPO = Path(__file__).resolve().parents[1]
COURSE = REPO / "notebooks"
LAB_TIMINGS: dict[str, dict[str, float]] = {}
# run first, in this order: each lab's pipeline (a scope of its own, dearest first: seconds on a
# quiet 2-core VM, stop 42), then the graded class; every other file is one scope after them
LAB_COST = {"10_search": 211, "11_tensor_parallel": 109, "02_pipeline": 72, "03_hdf5": 72, "06_ddp": 57,
            "08_oom": 51, "12_launch_bound": 51, "07_model_parallel": 43, "01_bottleneck": 38, "09_sharding": 28,
            "05_balanced": 27, "04_dataparallel": 22, "00_setup": 15}
NOTEBOOKS = "tests/test_notebooks.py"  # one test per lab: each lab a scope of its own
HEAVY_FILES = (NOTEBOOKS, "tests/test_grading_class.py")


def _order(item) -> tuple[int, float]:
    """Where an item's scope goes in the workers' queue: the labs (dearest first), the heavy files, the rest."""
    path = item.nodeid.split("::")[0]
    callspec = getattr(item, "callspec", None)
    if path == NOTEBOOKS and callspec is not None and "lab" in callspec.params:
        return 0, -LAB_COST.get(callspec.params["lab"], 60)
    return (1 if path in HEAVY_FILES else 2), 0.0


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with each lab's pipeline a scope of its own (see the module docstring)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LabsApart(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return nodeid if path == NOTEBOOKS else path

    return LabsApart(config, log)


def pytest_addoption(parser):
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="run the tests in a random order drawn from SEED (order-dependence check)")


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    elif hasattr(config, "workerinput"):  # an xdist worker (its numprocesses is None): the dearest scopes first
        items.sort(key=_order)  # a stable sort: a file's tests keep their order
    gpus = cuda_device_count()
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none visible to torch here)"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ CUDA GPUs ({gpus} visible)"))


def pytest_runtest_logreport(report):
    """Collect a lab's pipeline timings (``record_property("lab_timings", ...)``): here in the
    process that prints the summary, which under xdist is not the one that ran the test."""
    for name, value in getattr(report, "user_properties", ()):
        if name == "lab_timings" and report.when == "call":
            LAB_TIMINGS.update(value)


def pytest_terminal_summary(terminalreporter):
    if not LAB_TIMINGS:
        return
    terminalreporter.section("lab pipeline timings (seconds)")
    for lab, t in sorted(LAB_TIMINGS.items()):
        parts = ", ".join(f"{k} {v:.1f}" for k, v in t.items())
        terminalreporter.write_line(f"{lab:<20} {parts}")


def lab_class(course: Path, lab: str, full: tuple[str, ...], blank: tuple[str, ...]) -> Path:
    """A course root at ``course`` with ``lab`` released: ``full`` hand in the source notebook (every
    answer), ``blank`` the release copy (none)."""
    import shutil

    from gpulab.course.release import release

    shutil.copytree(COURSE / "source", course / "source")
    shutil.copy(COURSE / "nbgrader_config.py", course)
    release(course, lab)
    for s in full:
        shutil.copytree(course / "source" / lab, course / "submitted" / s / lab)
    for s in blank:
        shutil.copytree(course / "release" / lab, course / "submitted" / s / lab)
    return course
