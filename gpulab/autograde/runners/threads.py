"""Grade submissions here, in worker threads, each pinned to CPUs of its own (what a thread starts
inherits its CPU set); results as they finish."""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Iterator

from gpulab.accounts import students
from gpulab.autograde.limits import LabRun, Limits, SandboxResult
from gpulab.autograde.runners.one import grade_safely
from gpulab.confine import isolation


def pool(slots: list[list[int]]) -> ThreadPoolExecutor:
    """Worker threads, each pinned to one of ``slots``."""
    counter = itertools.count()

    def pin() -> None:
        os.sched_setaffinity(0, slots[next(counter) % len(slots)])

    return ThreadPoolExecutor(max_workers=len(slots), initializer=pin)


def each(slots: list[list[int]], work: Callable[..., Any], items: list[tuple]) -> Iterator[tuple[tuple, Any]]:
    """``work(*item)`` for every item in the pinned pool: (item, result or the exception raised)."""
    with pool(slots) as p:
        futures = {p.submit(work, *item): item for item in items}
        for fut in as_completed(futures):
            try:
                yield futures[fut], fut.result()
            except Exception as err:  # the caller decides what a failed item means
                yield futures[fut], err


def grade_here(slots: list[list[int]], course: Path, template: Path, specs: dict, runs: dict[str, LabRun],
               phase: list[tuple[str, str]], limits: Limits, root: Path, cancel: threading.Event,
               plan: isolation.Plan, secrets: list[Path]) -> Iterator[SandboxResult]:
    """Grade ``phase`` in worker threads pinned to ``slots``; results as they finish."""
    with pool(slots) as p:
        futures = [p.submit(grade_safely, course, template, specs[lab_], lab_, s,
                            root / lab_ / students.alias(s), limits, cancel, plan, secrets, runs[lab_])
                   for s, lab_ in phase]
        try:
            for fut in as_completed(futures):
                yield fut.result()
        except (KeyboardInterrupt, GeneratorExit):
            cancel.set()  # each worker kills its nbgrader and kernel within half a second
            raise
