"""gpulab.monitor.procstat: the CPU time of child processes counts toward this process."""

from __future__ import annotations

import multiprocessing as mp

from gpulab.accel import spin
from gpulab.monitor import UtilizationMonitor


def _spin_child(seconds: float) -> None:
    spin(seconds)


def test_child_processes_count_toward_this_process() -> None:
    ctx = mp.get_context("fork")
    child = ctx.Process(target=_spin_child, args=(0.6,))
    child.start()  # before the monitor, so its first scan finds the child (it rescans every 2 s)
    with UtilizationMonitor(interval=0.05, nvml=False) as mon:
        child.join()
    # the main thread only sleeps; anything well above zero is the child's spinning
    assert mon.arrays()["process"].max() > 20
