"""What a kernel and every process it started consumed, read by the grader from outside.

:class:`KernelMeter` reads counters that only the operating system writes: the CPU time of the
kernel's cgroup (``cpu.stat``), or of its process tree in ``/proc``, and the tree's I/O counters
(``/proc/<pid>/io``). A kernel can make them grow, never shrink: work it hides in another process
still counts, because a process's counters pass to whoever reaps it, and inside a PID namespace
an orphan is reaped by its init (which the meter reads too).

    meter = KernelMeter(kernel_pid, cgroup_dir)
    before = meter.read()
    ...                                   # the kernel runs a piece of work
    used = meter.read() - before          # Counters: cpu_s, read_chars, read_calls, read_bytes, write_chars
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import psutil

NSINIT = "gpulab.confine.nsinit"


@dataclass(frozen=True)
class Counters:
    """CPU seconds and I/O counts (None: this machine did not let the grader read them)."""

    cpu_s: float | None = None
    read_chars: int | None = None
    read_calls: int | None = None
    read_bytes: int | None = None
    write_chars: int | None = None

    def __sub__(self, other: "Counters") -> "Counters":
        def diff(name: str) -> float | int | None:
            a, b = getattr(self, name), getattr(other, name)
            return None if a is None or b is None else max(a - b, 0)

        return Counters(**{f.name: diff(f.name) for f in fields(self)})


def _cgroup_cpu(folder: str | None) -> float | None:
    if not folder:
        return None
    try:
        for line in (Path(folder) / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        return None
    return None


def _namespace_init() -> psutil.Process | None:
    """PID 1, when it is the submission's own init (a PID namespace of its own)."""
    try:
        init = psutil.Process(1)
        return init if any(NSINIT in part for part in init.cmdline()) else None
    except (psutil.Error, OSError):
        return None


class KernelMeter:
    """Counters of the process tree rooted at ``pid`` (and of ``cgroup``'s CPU time, when given)."""

    def __init__(self, pid: int, cgroup: str | None = None) -> None:
        self.pid, self.cgroup = pid, cgroup
        self.init = _namespace_init()

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def read(self) -> Counters:
        cpu: float | None = 0.0
        io = {"read_chars": 0, "read_calls": 0, "read_bytes": 0, "write_chars": 0}
        readable = True
        procs = self._tree()
        for proc in procs:
            try:
                t = proc.cpu_times()
                cpu += t.user + t.system + t.children_user + t.children_system
                c = proc.io_counters()
                io["read_chars"] += getattr(c, "read_chars", 0)
                io["read_calls"] += c.read_count
                io["read_bytes"] += c.read_bytes
                io["write_chars"] += getattr(c, "write_chars", 0)
            except psutil.NoSuchProcess:
                continue
            except (psutil.AccessDenied, OSError):
                readable = False
        if self.init is not None:  # orphans of the submission, reaped by its init: their counters are its
            try:
                t = self.init.cpu_times()
                cpu += t.children_user + t.children_system
                c = self.init.io_counters()
                io["read_chars"] += getattr(c, "read_chars", 0)
                io["read_calls"] += c.read_count
                io["read_bytes"] += c.read_bytes
                io["write_chars"] += getattr(c, "write_chars", 0)
            except psutil.Error:
                pass
        group = _cgroup_cpu(self.cgroup)
        if group is not None:
            cpu = group
        if not procs or not readable:
            return Counters(cpu_s=group)
        return Counters(cpu_s=cpu, **io)
