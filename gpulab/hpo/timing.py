"""When each trial ran, seen from the driver: a Tune callback for throughput and busy windows.

Wall time of ``tuner.fit()`` includes a fixed start-up (Ray starts a worker process per
concurrent trial, and each one imports torch: seconds) that a real search of hours amortises.
:class:`TrialTimer` records when every trial started and ended, so a search's **steady-state
throughput** (trials per hour between the first start and the last end) can be compared with
and without packing, and the utilisation monitor's samples can be cut to the same window::

    timer = TrialTimer()
    results = tune.Tuner(..., run_config=session.run_config(callbacks=[timer])).fit()
    timer.trials_per_hour, timer.window         # (first start, last end), time.perf_counter() seconds
    timer.max_concurrent                        # how many trials ran at once

Tune's ``Callback`` API: docs.ray.io, "Tune Callbacks" (``on_trial_start``, ``on_trial_complete``).
"""

from __future__ import annotations

import time
from typing import Any

from ray.tune import Callback

__all__ = ["TrialTimer", "mean_utilization"]


class TrialTimer(Callback):
    """Start and end times (``time.perf_counter()``) of every trial of one ``tuner.fit()``."""

    def __init__(self) -> None:
        self.starts: dict[str, float] = {}
        self.ends: dict[str, float] = {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.starts.setdefault(trial.trial_id, time.perf_counter())  # a restored trial keeps its first start

    def _end(self, trial: Any) -> None:
        self.ends[trial.trial_id] = time.perf_counter()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial)

    @property
    def window(self) -> tuple[float, float]:
        """(first start, last end); raises ValueError before any trial ended."""
        if not self.ends:
            raise ValueError("no trial has finished yet; pass the timer in RunConfig(callbacks=[timer]) and run fit()")
        return min(self.starts.values()), max(self.ends.values())

    @property
    def busy_s(self) -> float:
        """Seconds from the first trial's start to the last trial's end."""
        start, end = self.window
        return end - start

    @property
    def trials_per_hour(self) -> float:
        """Finished trials per hour over :attr:`window` (steady state: start-up excluded)."""
        return 3600.0 * len(self.ends) / max(self.busy_s, 1e-9)

    @property
    def max_concurrent(self) -> int:
        """The most trials that ran at the same time."""
        events = sorted([(t, 1) for t in self.starts.values()] + [(t, -1) for t in self.ends.values()])
        running = peak = 0
        for _, step in events:
            running += step
            peak = max(peak, running)
        return peak


def mean_utilization(monitor: Any, window: tuple[float, float], kind: str = "cpu") -> float:
    """Mean busy % of all CPU cores (``kind="cpu"``) or all NVML GPUs (``"gpu"``) that
    ``monitor`` (a :class:`gpulab.monitor.UtilizationMonitor`) sampled inside ``window``
    (``time.perf_counter()`` seconds, as :attr:`TrialTimer.window`). NaN if no sample falls inside.

    Raises:
        ValueError: for another ``kind``.
    """
    if kind not in ("cpu", "gpu"):
        raise ValueError(f"kind must be 'cpu' or 'gpu', got {kind!r}")
    a = monitor.arrays()
    values = a["cpu"] if kind == "cpu" else a["gpu_util"]  # (samples, cores or GPUs)
    t = a["t"] + monitor.t0  # sample times are perf_counter() - t0, t0 taken at start()
    inside = (t >= window[0]) & (t <= window[1])
    if not inside.any() or values.shape[1] == 0:
        return float("nan")
    return float(values[inside].mean())
