"""Shared by the monitor tests: wait for a monitor's samples on a machine that may be loaded."""

from __future__ import annotations

import time

from gpulab.monitor import UtilizationMonitor


def wait_for_samples(mon: UtilizationMonitor, n: int, timeout: float = 10.0, work=None) -> None:
    """Run ``work()`` (or sleep) until the monitor has ``n`` samples; a loaded machine may be slow."""
    deadline = time.perf_counter() + timeout
    while len(mon.samples) < n and time.perf_counter() < deadline:
        work() if work else time.sleep(0.01)
    assert len(mon.samples) >= n, f"only {len(mon.samples)} samples in {timeout} s"

