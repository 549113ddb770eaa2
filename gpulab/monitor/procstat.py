"""CPU counters from the kernel, as htop computes them: per core, and for a process tree.

Used by :class:`gpulab.monitor.UtilizationMonitor`. Differences of cumulative counters, rather
than ``psutil.cpu_percent()``, so that two monitors do not disturb each other's readings.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

__all__ = ["cpu_split", "ProcessTreeCpu"]


def cpu_split(times: Any) -> tuple[float, float]:
    """(busy, total) seconds of one core's counters, as psutil computes its percentages."""
    total = sum(times)
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)  # already in user/nice
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class ProcessTreeCpu:
    """CPU seconds used by a process (all its threads) plus, cumulatively, its descendants.

    Args:
        pid: the process (default: this one).
        include_children: count child processes too (DataLoader workers are children).
        rescan_s: how often to look for new children; a worker that exits between two reads
            loses only what it used since the last read.
    """

    def __init__(self, pid: int | None = None, include_children: bool = True, rescan_s: float = 2.0) -> None:
        self.proc = psutil.Process(pid or os.getpid())
        self.include_children = include_children
        self.rescan_s = rescan_s
        self._children: dict[int, tuple[psutil.Process, float]] = {}  # pid -> (process, CPU s at last read)
        self._children_total = 0.0
        self._scanned_at = -1e9

    def seconds(self) -> float:
        """Cumulative CPU seconds so far (monotonic)."""
        t = self.proc.cpu_times()
        if self.include_children:
            now = time.perf_counter()
            if now - self._scanned_at > self.rescan_s:
                self._scanned_at = now
                for pid in _descendants(self.proc):
                    if pid not in self._children:
                        try:
                            child = psutil.Process(pid)
                        except psutil.Error:
                            continue
                        self._children[pid] = (child, _child_cpu(child) or 0.0)
            for pid, (child, last) in list(self._children.items()):
                used = _child_cpu(child)
                if used is None:  # the child exited
                    del self._children[pid]
                    continue
                self._children_total += max(0.0, used - last)
                self._children[pid] = (child, used)
        return t.user + t.system + self._children_total


def _descendants(proc: psutil.Process) -> list[int]:
    """Child pids, recursively. Linux lists them in /proc/<pid>/task/<tid>/children, which costs
    about 0.1 ms; psutil's scan of every process (the fallback) costs a few ms."""
    try:
        found, todo = [], [proc.pid]
        while todo:
            pid = todo.pop()
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
                found += kids
                todo += kids
        return found
    except (OSError, ValueError):
        return [c.pid for c in proc.children(recursive=True)]


def _child_cpu(child: psutil.Process) -> float | None:
    try:
        t = child.cpu_times()
        return t.user + t.system
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
