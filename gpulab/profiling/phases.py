"""A training loop's data wait and step, measured twice, by two instruments that share nothing.

- :func:`profile_phases` (lab 01's reference for the exercise of the same name) records the loop
  with ``torch.profiler`` directly: two ``record_function`` ranges of its own in each step,
  :data:`DATA` around ``next(loader)`` and :data:`STEP` around the training step;
- :class:`Stopwatch` times the same run from outside, with ``time.perf_counter()`` (how the two
  share nothing: the comment below the imports).

    watch = Stopwatch()
    prof = profile_phases(watch.loader(loader), watch.step(train_step), "loop.json", active=6)
    trace_shares("loop.json", [DATA, STEP])   # the profiler: each range / the recorded steps
    watch.shares(skip=2)                      # the stopwatch, over the same 6 steps

    .venv/bin/python -m pytest tests/profiling/test_phases.py
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch.profiler import ProfilerActivity, record_function

# profile_phases uses a ``schedule(wait=1, warmup=1, active=...)``, ``prof.step()`` after every
# step, and its own two ranges: ``profile_loop``'s ``gpulab/...`` ranges appear nowhere. Stopwatch
# wraps the loader and the step and reads ``time.perf_counter()`` around each batch fetched and
# each step called. It opens no profiler range and reads nothing the profiler wrote, so when the two
# agree, they agree about the loop, not about each other's labels.
#
# The loop itself is the seed posts' ``for batch in loader: train_step(batch)``, written with an
# explicit ``next()`` so that the wait for a batch can sit inside a range.

__all__ = ["DATA", "STEP", "Stopwatch", "profile_phases", "trace_shares"]

DATA = "data"  # waiting for the loader's next batch
STEP = "step"  # the training step (forward, backward, optimizer; on a GPU, their launches)


class Stopwatch:
    """Times every batch a wrapped loader yields and every call of a wrapped step (perf_counter)."""

    def __init__(self) -> None:
        self.data_s: list[float] = []
        self.step_s: list[float] = []

    def loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """``loader``, timed: each ``next()`` that yields a batch appends its seconds to ``data_s``."""
        watch = self

        class _Timed:
            def __len__(self) -> int:
                return len(loader)  # type: ignore[arg-type]

            def __iter__(self) -> Iterator[Any]:
                it = iter(loader)
                while True:
                    t0 = time.perf_counter()
                    try:
                        batch = next(it)
                    except StopIteration:
                        return
                    watch.data_s.append(time.perf_counter() - t0)
                    yield batch

        return _Timed()

    def step(self, step_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``step_fn``, timed: each call appends its seconds to ``step_s``."""
        def timed(batch: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return step_fn(batch)
            finally:
                self.step_s.append(time.perf_counter() - t0)

        return timed

    def shares(self, skip: int = 0) -> dict[str, float]:
        """``{DATA: ..., STEP: ...}``: each phase's share of data + step time, over the steps after
        the first ``skip`` (the ones a profiler schedule does not record).

        Raises:
            ValueError: if no step was timed after ``skip``.
        """
        data, step = self.data_s[skip:], self.step_s[skip:len(self.data_s)]
        total = sum(data) + sum(step)
        if not data or total <= 0:
            raise ValueError(f"the stopwatch timed {len(self.data_s)} steps; none after skipping {skip}")
        return {DATA: sum(data) / total, STEP: sum(step) / total}


def profile_phases(loader: Iterable[Any], train_step: Callable[[Any], Any], trace_path: str | os.PathLike,
                   active: int = 6) -> torch.profiler.profile:
    """Profile ``for batch in loader: train_step(batch)`` with torch.profiler: 1 step skipped,
    1 warm-up, ``active`` recorded, each with a :data:`DATA` range around fetching the batch and a
    :data:`STEP` range around the step; the trace written to ``trace_path``.

    Returns:
        The profiler.

    Raises:
        ValueError: if the loader has fewer than ``2 + active`` batches.
    """
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and ProfilerActivity.CUDA in torch.profiler.supported_activities():
        acts.append(ProfilerActivity.CUDA)
    it = iter(loader)
    with torch.profiler.profile(activities=acts,
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=active)) as prof:
        for i in range(2 + active):
            with record_function(DATA):
                batch = next(it, None)  # the wait for the batch, inside the step's range
            if batch is None:
                raise ValueError(f"the loader ran out after {i} batches; profiling needs 2 + active = {2 + active}")
            with record_function(STEP):
                train_step(batch)
            prof.step()
    prof.export_chrome_trace(str(trace_path))
    return prof


def trace_shares(path: str | os.PathLike, labels: Sequence[str], *, of_labels: bool = False) -> dict[str, float]:
    """Each label's share of the recorded steps, read from a Chrome trace (the ranges' ``dur`` on
    the CPU's timeline, over the ``ProfilerStep#N`` ranges' ``dur``), not from ``key_averages()``.
    With ``of_labels=True`` the shares are of the labels' own total instead, as :meth:`Stopwatch.shares`
    counts them (the profiler's own work between the ranges then drops out of both sides).

    Raises:
        ValueError: if the trace has no ``ProfilerStep`` range.
    """
    with open(path) as fh:
        events = [e for e in json.load(fh).get("traceEvents", []) if e.get("cat") == "user_annotation"]
    steps = sum(float(e.get("dur", 0)) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    if steps <= 0:
        raise ValueError(f"{path} has no ProfilerStep ranges: profile with a schedule and call prof.step()")
    durs = {name: sum(float(e.get("dur", 0)) for e in events if e.get("name") == name) for name in labels}
    total = sum(durs.values()) if of_labels else steps
    return {name: d / total if total > 0 else 0.0 for name, d in durs.items()}
