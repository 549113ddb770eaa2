"""gpulab.course.processes: a submission's processes are stopped by tree (children included) and by
the GPULAB_SANDBOX marker (a process that left the tree), and nothing else is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from gpulab.course.processes import kill_marked, kill_tree

SLEEPER = "import time; time.sleep(120)"


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_kill_tree_stops_a_process_and_its_children() -> None:
    # a parent that starts a grandchild, then sleeps; both must go
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 30
        while not children and time.monotonic() < deadline:
            children = psutil.Process(parent.pid).children()
            time.sleep(0.05)
        [child] = children
        kill_tree(parent.pid)
        parent.wait(timeout=10)
        assert _gone(child.pid), "the grandchild outlived kill_tree"
    finally:
        for p in children:  # if kill_tree failed, leave nothing behind
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        parent.kill()
        parent.wait(timeout=10)
    kill_tree(parent.pid)  # a process that is gone already: nothing to do, no error


def test_kill_marked_stops_only_the_marked_processes() -> None:
    marker = f"test-{os.getpid()}-{time.monotonic_ns()}"
    marked = subprocess.Popen([sys.executable, "-c", SLEEPER], env={**os.environ, "GPULAB_SANDBOX": marker})
    other = subprocess.Popen([sys.executable, "-c", SLEEPER], env={**os.environ, "GPULAB_SANDBOX": marker + "-other"})
    try:
        deadline = time.monotonic() + 30  # wait until the marked process's environment is readable
        while psutil.Process(marked.pid).environ().get("GPULAB_SANDBOX") != marker and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kill_marked(marker) == 1
        marked.wait(timeout=10)
        assert other.poll() is None, "a process with another marker was killed"
        assert kill_marked(marker) == 0
    finally:
        marked.kill()
        other.kill()
        other.wait(timeout=10)
