"""gpulab.confine.signal_targets: a signal to the kernel's own processes, live or already reaped, stays
inside; one that reaches a process the kernel did not start is named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gpulab.confine.signal_targets import outside, targets

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")


def _orphan() -> int:
    """A sleep in a session of its own whose parent has exited: not this process's descendant."""
    code = ("import subprocess; print(subprocess.Popen(['sleep', '30'], start_new_session=True, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_a_reaped_job_s_group_is_its_own() -> None:
    # lab 06's script grader: a job in its own session, waited for, then its group swept with killpg
    job = subprocess.Popen(["sleep", "0"], start_new_session=True)
    job.wait()
    assert targets(job.pid, True, os.getpid()) == (f"process group {job.pid}", [])
    assert outside(job.pid, True, os.getpid()) is None
    assert outside(job.pid, False, os.getpid()) is None
    assert outside(-job.pid, False, os.getpid()) is None


def test_a_live_job_s_group_and_its_grandchildren_are_its_own() -> None:
    job = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(targets(job.pid, True, os.getpid())[1]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(targets(job.pid, True, os.getpid())[1]) == 2  # sh and its sleep
        assert outside(job.pid, True, os.getpid()) is None
        assert outside(-job.pid, False, os.getpid()) is None
        assert outside(job.pid, False, os.getpid()) is None
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_a_process_it_did_not_start_is_named() -> None:
    victim = _orphan()
    try:
        me = os.getpid()
        assert outside(victim, False, me) == f"pid {victim}"
        assert outside(victim, True, me) == f"process group {victim}"
        assert outside(-victim, False, me) == f"process group {victim}"
        assert outside(-1, False, me) == "every process (pid -1)"
    finally:
        os.kill(victim, signal.SIGKILL)


def test_in_the_submissions_namespace_an_orphan_is_the_kernels_and_its_ancestors_are_not() -> None:
    """Issue 48: lab 06's launcher sweeps its rank groups with killpg after the ranks exited; their
    DataLoader workers were handed to PID 1 by then. In the submission's own PID namespace (PID 1
    is gpulab's init) such an orphan is the kernel's; nbgrader (the kernel's parent) and a process
    of another branch (a sibling of the kernel) are still named."""
    me = subprocess.Popen(["sleep", "30"])  # stands for the kernel
    sibling = subprocess.Popen(["sleep", "30"])  # another child of the kernel's parent
    victim = _orphan()
    try:
        assert outside(victim, True, me.pid, orphans_are_mine=True) is None
        assert outside(victim, True, me.pid, orphans_are_mine=False) == f"process group {victim}"
        assert outside(os.getpid(), False, me.pid, orphans_are_mine=True) == f"pid {os.getpid()}"
        assert outside(sibling.pid, False, me.pid, orphans_are_mine=True) == f"pid {sibling.pid}"
        assert outside(1, False, me.pid, orphans_are_mine=True) == "pid 1"
    finally:
        os.kill(victim, signal.SIGKILL)
        for p in (me, sibling):
            p.kill()
            p.wait()
