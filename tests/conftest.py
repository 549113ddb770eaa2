"""Shared test set-up: GPU tiers and a summary of how long each lab took in the nbgrader pipeline.

tests/ mirrors the package: the tests of gpulab/<package>/<module>.py are in
tests/<package>/test_<module>.py (the sub-folders are packages, so names may repeat across them);
the notebook pipeline tests, the layout test and the shared fixtures stay at this level.

Markers (see pyproject.toml): ``gpu`` and ``multigpu`` tests are skipped where torch cannot see
enough CUDA devices; ``notebook`` marks the slow end-to-end lab runs (``make test-fast`` skips them).

``make test TEST_WORKERS=2`` runs the suite on two pytest-xdist workers, a file per worker at a time
(``--dist loadfile``), the heaviest files first: the lab pipelines on one worker while the other
grades the adversarial class and then runs everything else. A lab's pipeline timings travel to the
summary as the test's user properties, so they are printed with or without workers.

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
# run first (in this order), each on its own worker: the lab pipelines, then the graded class
HEAVY_FIRST = ("tests/test_notebooks.py", "tests/test_grading_class.py")


def pytest_addoption(parser):
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="run the tests in a random order drawn from SEED (order-dependence check)")


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    elif config.getoption("numprocesses", None):  # workers: the heavy files first (a stable sort)
        rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
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
