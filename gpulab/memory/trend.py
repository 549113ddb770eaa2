"""Is memory growing steadily? The leak criterion of :class:`~gpulab.memory.LeakFinder`.

A leak is memory that every step keeps: the *floor* of the live bytes (what survives between
steps) rises step after step. A cache filled once raises it once; variable-sized batches move it
up and down. The criterion below looks for a floor that rises in every part of a window, by more
than a threshold and more than the noise, and is a pure function of the history, so it can be
tested on made-up histories.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

__all__ = ["LeakCriterion"]


@dataclass(frozen=True)
class LeakCriterion:
    """When does memory "grow steadily"?

    The last ``window`` steps are cut into ``segments`` equal parts, and each part's *floor* (its
    lowest live memory: what every step in it kept) is taken. Memory leaks when every floor is
    above the one before by at least ``threshold`` bytes per step of the part, and by more than
    the step-to-step noise (1.48 x the median absolute deviation of the differences, a robust
    standard deviation).

    - A one-off allocation (optimizer state, a cache) raises one floor, not all of them.
    - Noise moves floors up and down, and its size raises the bar.
    - A leak every step, or every other step, raises all of them.

    Warning:
        A leak smaller per step than the noise, or slower than one allocation per part, needs a
        longer ``window``; the first ``window - 1`` steps can never be flagged.

    Args:
        window: how many of the latest steps are judged (at least 2 per segment).
        segments: parts the window is cut into (>= 2).
        threshold: least growth in bytes per step that counts as a leak.
    """

    window: int = 12
    segments: int = 4
    threshold: int = 1024

    def __post_init__(self) -> None:
        if not (isinstance(self.segments, int) and self.segments >= 2):
            raise ValueError(f"segments must be an int >= 2, got {self.segments!r}")
        if not (isinstance(self.window, int) and self.window >= 2 * self.segments):
            raise ValueError(f"window must be an int >= 2 * segments = {2 * self.segments} (each part needs two "
                             f"steps), got {self.window!r}")
        if not (isinstance(self.threshold, (int, float)) and self.threshold >= 0):
            raise ValueError(f"threshold is bytes per step, >= 0; got {self.threshold!r}")

    def check(self, history: list[int]) -> bool:
        """True if the latest ``window`` values of ``history`` (live bytes per step) leak."""
        if len(history) < self.window:
            return False
        w = history[-self.window:]
        part = self.window // self.segments
        w = w[len(w) - part * self.segments:]  # whole parts, the latest steps
        diffs = [b - a for a, b in zip(w, w[1:])]
        mid = statistics.median(diffs)
        noise = 1.4826 * statistics.median(abs(d - mid) for d in diffs)
        floors = [min(w[i * part:(i + 1) * part]) for i in range(self.segments)]
        need = max(self.threshold * part, noise, 1)
        return all(b - a >= need for a, b in zip(floors, floors[1:]))
