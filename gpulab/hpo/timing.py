"""When each trial ran, seen from the driver: a Tune callback for throughput and busy windows.

Wall time of ``tuner.fit()`` includes a start-up (Ray starts a worker process per concurrent
trial, and each one imports torch and builds its data: seconds) and a tail (the last trials run
while other slots idle) that a real search of hours amortises. :class:`TrialTimer` records when
every trial started, reported and ended, so that a search's **steady-state throughput** can be
compared with and without packing: the trial-epochs reported per second from the moment every
slot has produced a result to the moment the last trial starts (after that, slots empty out).
The utilisation monitor's samples can be cut to the same window::

    timer = TrialTimer()
    results = tune.Tuner(..., run_config=session.run_config(callbacks=[timer])).fit()
    timer.trials_per_hour, timer.steady_window  # time.perf_counter() seconds, the monitor's clock
    timer.max_concurrent                        # how many trials ran at once

Tune's ``Callback`` API: docs.ray.io, "Tune Callbacks" (``on_trial_start``, ``on_trial_complete``).
"""

from __future__ import annotations

import math
import time
from typing import Any

from ray.tune import Callback

__all__ = ["TrialTimer", "mean_utilization"]


class TrialTimer(Callback):
    """Start, result and end times (``time.perf_counter()``) of the trials of one ``tuner.fit()``."""

    def __init__(self) -> None:
        self.starts: dict[str, float] = {}
        self.ends: dict[str, float] = {}
        self.results: list[tuple[float, str]] = []  # (time, trial id), one per reported epoch

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.starts.setdefault(trial.trial_id, time.perf_counter())  # a restored trial keeps its first start

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.results.append((time.perf_counter(), trial.trial_id))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.ends[trial.trial_id] = time.perf_counter()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.ends[trial.trial_id] = time.perf_counter()

    @property
    def window(self) -> tuple[float, float]:
        """(first start, last end).

        Raises:
            ValueError: before any trial ended.
        """
        if not self.ends:
            raise ValueError("no trial has finished yet; pass the timer in RunConfig(callbacks=[timer]) and run fit()")
        return min(self.starts.values()), max(self.ends.values())

    @property
    def steady_window(self) -> tuple[float, float]:
        """(every slot warm, last trial start): all ``max_concurrent`` slots are producing.

        Falls back to :attr:`window` when the search is too short to have one (no more trials
        than slots, or less than 0.5 s between the two instants).
        """
        first_result: dict[str, float] = {}
        for t, tid in self.results:
            first_result.setdefault(tid, t)
        first_slots = sorted(self.starts, key=self.starts.get)[:self.max_concurrent]
        warm = [first_result[tid] for tid in first_slots if tid in first_result]
        begin, end = (max(warm) if warm else math.inf), max(self.starts.values(), default=-math.inf)
        return (begin, end) if end - begin >= 0.5 else self.window

    @property
    def epochs_per_s(self) -> float:
        """Trial-epochs reported per second inside :attr:`steady_window`."""
        begin, end = self.steady_window
        inside = sum(1 for t, _ in self.results if begin < t <= end)
        return inside / max(end - begin, 1e-9)

    @property
    def trials_per_hour(self) -> float:
        """Steady-state throughput in trials per hour: :attr:`epochs_per_s` over the mean epochs
        of a finished trial (so a search whose trials stop early finishes more per hour)."""
        if not self.ends:
            raise ValueError("no trial has finished yet")
        epochs_per_trial = len(self.results) / max(len(self.starts), 1)
        return 3600.0 * self.epochs_per_s / max(epochs_per_trial, 1e-9)

    @property
    def max_concurrent(self) -> int:
        """The most trials that ran at the same time."""
        events = sorted([(t, 1) for t in self.starts.values()] + [(t, -1) for t in self.ends.values()])
        running = peak = 0
        for _, step in events:
            running += step
            peak = max(peak, running)
        return peak


def mean_utilization(monitor: Any, window: tuple[float, float], kind: str = "search") -> float:
    """Mean busy % that ``monitor`` (a :class:`gpulab.monitor.UtilizationMonitor`) sampled
    inside ``window`` (``time.perf_counter()`` seconds, as :attr:`TrialTimer.steady_window`).

    Args:
        kind: ``"search"``: this process and its children (the raylet's trial workers) as a share
            of all cores, i.e. how much of the machine the search used; ``"cpu"``: all cores,
            whoever used them (htop); ``"gpu"``: all NVML GPUs (nvidia-smi's GPU-Util).

    Returns:
        The mean in %, NaN if no sample falls inside the window (or no GPU for ``"gpu"``).

    Raises:
        ValueError: for another ``kind``.
    """
    if kind not in ("search", "cpu", "gpu"):
        raise ValueError(f"kind must be 'search', 'cpu' or 'gpu', got {kind!r}")
    a = monitor.arrays()
    cores = max(a["cpu"].shape[1], 1)
    values = {"search": a["process"].reshape(-1, 1) / cores, "cpu": a["cpu"], "gpu": a["gpu_util"]}[kind]  # (N, k)
    t = a["t"] + monitor.t0  # sample times are perf_counter() - t0, t0 taken at start()
    inside = (t >= window[0]) & (t <= window[1])
    if not inside.any() or values.shape[1] == 0:
        return float("nan")
    return float(values[inside].mean())
