"""Timing variants side by side: the one interleaved timer every ratio in gpulab comes from.

Timing two versions one after the other lets the machine's load change in between; running them
in turns (A B A B ...), rotating who goes first, makes both see the same load, and a ratio of
medians then says something on any machine. Lab checks and benchmarks grade such ratios, never
absolute times.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tqdm.auto import tqdm

from gpulab.devices.physical import synchronize_all

__all__ = ["Timings", "timed_call", "time_interleaved", "SpeedComparison", "compare_speed"]


@dataclass
class Timings:
    """Wall and CPU seconds per call of each variant, from :func:`time_interleaved`."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        """Median wall seconds per call."""
        return statistics.median(self.wall[name])

    def speedup(self, baseline: str, candidate: str) -> float:
        """How many times faster ``candidate`` is than ``baseline`` (ratio of medians)."""
        return self.median(baseline) / self.median(candidate)

    def cores(self, name: str) -> float:
        """Average cores the variant used: process CPU seconds / wall seconds."""
        return sum(self.cpu[name]) / sum(self.wall[name])

    def table(self) -> str:
        """A text table: median ms and cores used, per variant."""
        width = max(len(n) for n in self.wall)
        return "\n".join(f"{n:<{width}}  {self.median(n) * 1e3:8.1f} ms   {self.cores(n):.2f} cores"
                         for n in self.wall)


def timed_call(fn: Callable[[], Any]) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one ``fn()``, the GPU work it queued included: every GPU in use is
    synchronised before the clocks start (earlier work is not this call's) and before they stop."""
    synchronize_all()
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    synchronize_all()
    return time.perf_counter() - t0, time.process_time() - c0


def time_interleaved(variants: Mapping[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1,
                     *, progress: bool = False, desc: str = "timing",
                     before_each: Callable[[], Any] | None = None) -> Timings:
    """Time each variant ``repeats`` times, interleaved, after ``warmup`` untimed rounds.

    Args:
        variants: name -> a callable doing one unit of work (e.g. one training step).
        repeats: timed rounds; each round calls every variant once.
        warmup: untimed rounds first (allocator, kernel selection, thread start-up).
        progress: show a tqdm bar over the rounds.
        desc: the bar's label.
        before_each: called, untimed, before every call (warm-up ones too): e.g. a barrier, so that
            ranks timing a collective start together and the time is the step's, not the wait's.

    Raises:
        ValueError: for no variants or ``repeats < 1``.
    """
    if not variants or repeats < 1:
        raise ValueError(f"need at least one variant and repeats >= 1, got {len(variants)} variants, "
                         f"repeats={repeats}")
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            if before_each is not None:
                before_each()
            variants[name]()
    out = Timings({n: [] for n in names}, {n: [] for n in names})
    for r in tqdm(range(repeats), desc=desc, disable=not progress, leave=False):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate who goes first
            if before_each is not None:
                before_each()
            wall, cpu = timed_call(variants[name])
            out.wall[name].append(wall)
            out.cpu[name].append(cpu)
    return out


@dataclass
class SpeedComparison:
    """Result of :func:`compare_speed`: median seconds per call and their ratio."""

    baseline_s: float
    candidate_s: float

    @property
    def speedup(self) -> float:
        """How many times faster the candidate is (baseline time / candidate time)."""
        return self.baseline_s / max(self.candidate_s, 1e-12)

    def __str__(self) -> str:
        return f"baseline {self.baseline_s * 1e3:.1f} ms, candidate {self.candidate_s * 1e3:.1f} ms, speedup {self.speedup:.2f}x"


def compare_speed(baseline: Callable[[], Any], candidate: Callable[[], Any], *, repeats: int = 5,
                  warmup: int = 1) -> SpeedComparison:
    """Time two callables interleaved (:func:`time_interleaved`) and compare their medians.

    Raises:
        ValueError: if ``repeats < 1``.
    """
    t = time_interleaved({"baseline": baseline, "candidate": candidate}, repeats=repeats, warmup=warmup)
    return SpeedComparison(t.median("baseline"), t.median("candidate"))
