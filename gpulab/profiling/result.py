"""``LoopProfile``: what :func:`gpulab.profiling.profile_loop` measured, and how to read it.

Per-step arrays of host phases (data wait, copy, sync, host work) and device compute, the device's
busy intervals, and the derived figures: ``busy_fraction``, ``fractions``, ``bound`` and the
``verdict`` sentence (both from :mod:`gpulab.profiling.bottleneck`), ``throughput``, ``timeline()``,
``summary()`` and ``plot()``.

While lab 01 is graded, the busy fraction and the classification are the student's exercises and
gpulab's versions are masked (:mod:`gpulab.autograde.box.mask`): a profile then takes its busy fraction
from the per-step device time it measured (the same figure), and its bound and verdict say they
are hidden, so the lab's demos still run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpulab import MaskedReference
from gpulab.profiling import bottleneck
from gpulab.profiling.view import format_profile, plot_profile

__all__ = ["LoopProfile"]


@dataclass
class LoopProfile:
    """What :func:`profile_loop` measured. Times are seconds; per-step arrays have one entry per step.

    Attributes:
        mode: ``"cuda"``, ``"simulated"`` or ``"host"``; ``device`` names the device.
        step_s: wall time of each step (from one batch request to the next); sums to ``wall_s``.
        data_s, copy_s, sync_s, host_s: the host's time per step in each phase.
        compute_s: device compute per step.
        host_times: ``(num_steps, 4)`` host clock at batch request, batch received, copy done,
            ``step_fn`` returned; relative to the window start.
        device_intervals: the device's compute intervals ``(start, end)``, window-relative.
        num_workers: the loader's ``num_workers`` (None if it is not a DataLoader).
    """

    mode: str
    device: str
    step_s: np.ndarray
    data_s: np.ndarray
    copy_s: np.ndarray
    sync_s: np.ndarray
    host_s: np.ndarray
    compute_s: np.ndarray
    host_times: np.ndarray
    device_intervals: list[tuple[float, float]]
    wall_s: float
    num_workers: int | None = None
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    batch_size: int | None = None
    epochs: int = 1

    @property
    def num_steps(self) -> int:
        return len(self.step_s)

    @property
    def busy_fraction(self) -> float:
        """Share of the wall time the device spent computing (0..1)."""
        if self.wall_s <= 0:
            return 0.0
        try:
            return bottleneck.busy_fraction(self.device_intervals, 0.0, self.wall_s)
        except MaskedReference:  # lab 01 is being graded: the device time each step measured, which
            # is the union of the device intervals (one queue: they neither overlap nor leave the window)
            return float(min(1.0, max(0.0, self.compute_s.sum() / self.wall_s)))

    @property
    def fractions(self) -> dict[str, float]:
        """Host-side shares of the wall time (``data``, ``copy``, ``sync``, ``host``, ``other``)
        plus ``compute``, the device's busy share."""
        w = max(self.wall_s, 1e-12)
        f = {"data": float(self.data_s.sum() / w), "copy": float(self.copy_s.sum() / w),
             "sync": float(self.sync_s.sum() / w), "host": float(self.host_s.sum() / w)}
        # other: the wall time outside every step's marked span, from its batch request to step_fn's
        # return (the loop's own overhead, the final drain of the queue). Inside the spans the four
        # phases add up, except on the host device, where step_fn's time is compute instead.
        in_steps = float((self.host_times[:, 3] - self.host_times[:, 0]).sum())
        f["other"] = max(0.0, 1.0 - in_steps / w)
        f["compute"] = self.busy_fraction
        return f

    @property
    def steps_per_s(self) -> float:
        return self.num_steps / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Samples per second (steps per second when the batch size is unknown)."""
        return self.steps_per_s * (self.batch_size or 1)

    @property
    def bound(self) -> str:
        """``"compute"``, ``"data"``, ``"copy"``, ``"sync"`` or ``"host"`` (see :func:`gpulab.profiling.bottleneck.classify`);
        ``"hidden"`` while lab 01, whose exercise it is, is graded."""
        try:
            return bottleneck.classify(self.busy_fraction, self.fractions)
        except MaskedReference:
            return "hidden"

    @property
    def verdict(self) -> str:
        """One sentence naming the bound and what to try next."""
        try:
            return bottleneck.verdict(self.busy_fraction, self.fractions, self.num_workers, self.cpu_count,
                                      device_work_seen=self.compute_s.sum() > 0)
        except MaskedReference:
            return "hidden while this lab is graded (classifying the loop is an exercise)"

    def timeline(self) -> dict[str, list[tuple[float, float]]]:
        """Intervals per lane, window-relative: host data wait / copy / step_fn, device compute."""
        h = self.host_times
        return {
            "host: data wait": [(a, b) for a, b in zip(h[:, 0], h[:, 1])],
            "host: copy": [(a, b) for a, b in zip(h[:, 1], h[:, 2])],
            "host: step_fn": [(a, b) for a, b in zip(h[:, 2], h[:, 3])],
            "device: compute": list(self.device_intervals),
        }

    def to_dict(self) -> dict[str, Any]:
        """Summary numbers (JSON-friendly)."""
        return {"mode": self.mode, "device": self.device, "num_steps": self.num_steps, "wall_s": self.wall_s,
                "busy_fraction": self.busy_fraction, "fractions": self.fractions, "bound": self.bound,
                "throughput": self.throughput, "num_workers": self.num_workers, "cpu_count": self.cpu_count,
                "batch_size": self.batch_size, "verdict": self.verdict}

    def summary(self) -> str:
        """A small text report: the phases and the verdict."""
        return format_profile(self)

    __str__ = summary

    def __repr__(self) -> str:
        return (f"LoopProfile({self.mode}, steps={self.num_steps}, busy={self.busy_fraction:.2f}, "
                f"bound={self.bound!r})")

    def plot(self, max_steps: int = 12, ax: Any = None) -> Any:
        """Timeline of the first ``max_steps`` steps (host lanes over the device lane) and the
        per-step breakdown; only the timeline when an ``ax`` is given. Returns the figure."""
        return plot_profile(self, max_steps, ax)
