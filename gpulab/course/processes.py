"""Stop what a graded notebook started: its process tree, and anything that left the tree.

A kernel runs in a session of its own, and a student's code can start processes that detach
(double fork, ``setsid``). Where the submission has a PID namespace and a cgroup
(:mod:`gpulab.course.isolation`), their end takes every such process with it. Without them, the
grader marks every process of a submission with ``GPULAB_SANDBOX=<grading copy>`` in its
environment, which children inherit, and kills by tree and by marker when the submission is done
or out of time; a process that drops the marker as well as leaving the tree escapes that.
"""

from __future__ import annotations

import os

import psutil


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)


def kill_marked(marker: str) -> int:
    """SIGKILL every process of this user whose environment carries ``GPULAB_SANDBOX=marker``
    (a student's process that outlived its kernel, even one that left the process tree)."""
    killed = 0
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("GPULAB_SANDBOX") == marker:
                p.kill()
                killed += 1
        except (psutil.Error, OSError):
            continue
    return killed
