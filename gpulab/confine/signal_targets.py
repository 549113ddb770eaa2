"""Which processes a ``kill(2)`` from a student's kernel would reach, and whether any of them lies
outside the kernel's own tree (read from ``/proc``; Linux only, empty elsewhere).

The jail's audit hook (:func:`gpulab.confine.jail.file_guard`) notes a signal to a process outside
the kernel: the grader, nbgrader, a classmate. Honest code signals its own processes, often after
they are gone: ``subprocess.Popen(..., start_new_session=True)``, ``proc.wait()``, then
``os.killpg(proc.pid, SIGKILL)`` to sweep whatever the job left in its group. The leader is reaped by
then, so its pid no longer says whose it was; what counts is who is still there to be signalled.
"""

from __future__ import annotations

import os


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, process group) of ``pid``; None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
        return int(fields[1]), int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor``'s child, grandchild... (False when unknown)."""
    for _ in range(64):
        stat = _stat(pid)
        if stat is None:
            return False
        pid = stat[0]
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def _live_pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def targets(pid: int, group: bool, me: int) -> tuple[str, list[int]]:
    """(a name for what is signalled, the live processes it reaches) for ``os.kill(pid, ...)``
    (``group=False``) or ``os.killpg(pid, ...)`` (``group=True``) called in ``me``'s tree."""
    if not group and pid > 0:
        return f"pid {pid}", [pid] if _stat(pid) is not None else []
    if not group and pid == -1:
        return "every process (pid -1)", [p for p in _live_pids() if p != me]
    if pid == 0 or (not group and pid < -1):
        pgid = os.getpgid(0) if pid == 0 else -pid
    else:
        pgid = pid
    members = [p for p in _live_pids() if (_stat(p) or (0, None))[1] == pgid]
    return f"process group {pgid}", members


def _in_own_namespace() -> bool:
    """Whether PID 1 here is gpulab's own init (:mod:`gpulab.confine.nsinit`): the submission's PID
    namespace, where every process was started by the kernel, nbgrader or that init."""
    try:
        with open("/proc/1/cmdline", "rb") as fh:
            return b"gpulab.confine.nsinit" in fh.read()
    except OSError:
        return False


def _ancestors(me: int) -> set[int]:
    out, pid = set(), me
    for _ in range(64):
        stat = _stat(pid)
        if stat is None or stat[0] <= 1:
            break
        pid = stat[0]
        out.add(pid)
    return out


def _is_mine(pid: int, me: int, ancestors: set[int], orphans_are_mine: bool) -> bool:
    """``pid`` is ``me``, a descendant, or (in the submission's own PID namespace) an orphan: its
    parent died and it was handed to PID 1, which only the kernel's own processes are (a DataLoader
    worker whose rank exited, the launcher's rank groups); nbgrader and the init start none."""
    for _ in range(64):
        if pid == me:
            return True
        if pid in ancestors:
            return False
        stat = _stat(pid)
        if stat is None:
            return True  # gone (or going) while we looked: nothing left to signal there
        if stat[0] <= 1:
            return orphans_are_mine and pid != 1
        pid = stat[0]
    return False


def outside(pid: int, group: bool, me: int, orphans_are_mine: bool | None = None) -> str | None:
    """What ``os.kill``/``os.killpg(pid, ...)`` names, if it would reach a live process that is
    neither ``me`` nor one of its own (see :func:`_is_mine`; ``orphans_are_mine``: default, whether
    this is the submission's PID namespace); None for a signal that stays in the kernel's processes
    or reaches nobody (the call then fails with ``ProcessLookupError``)."""
    name, live = targets(pid, group, me)
    if orphans_are_mine is None:
        orphans_are_mine = _in_own_namespace()
    ancestors = _ancestors(me)
    if any(not _is_mine(p, me, ancestors, orphans_are_mine) for p in live):
        return name
    return None
