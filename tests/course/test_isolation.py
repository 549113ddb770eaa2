"""gpulab.course.isolation, cgroups and nsinit: each submission's namespaces, cgroup and kernel uid,
tried for real on this machine (root on Linux here and in CI); and the refusal, flag and note where
a layer is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tty
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from gpulab.course import cgroups, isolation
from gpulab.course.notes import isolation_notes

PLAN = isolation.detect()
needs_ns = pytest.mark.skipif(not PLAN.namespaces, reason=f"no namespaces here: {PLAN.why_not_namespaces}")
needs_cgroups = pytest.mark.skipif(not PLAN.cgroups.complete, reason=f"no cgroups here: {PLAN.cgroups.describe()}")
needs_root = pytest.mark.skipif(not PLAN.kernel_uid, reason="the kernel's own uid needs a root grader and setpriv")
SLEEP = "import time; time.sleep(300)"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@needs_cgroups
def test_cgroup_caps_the_kernels_processes_and_kills_the_whole_group() -> None:
    group = cgroups.Group(PLAN.cgroups, pids_max=64, memory_bytes=512 * 2**20)
    # joins the kernel leaf as a kernel does, forks until refused, then leaves its children sleeping
    code = """
import os, time
born = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(300)
        os._exit(0)
    born += 1
print(born, flush=True)
time.sleep(300)
"""
    cmd = isolation._joiner(group.procs_files("kernel")) + [sys.executable, "-c", code]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        born = int(proc.stdout.readline())
        assert 40 < born < 64, born  # the cap counts the parent and its threads too
        members = group.members()
        assert proc.pid in members and len(members) == born + 1
        peaks = group.peaks()
        assert peaks["pids_refused"] and peaks["pids_peak"] == 64
        assert group.kill() == born + 1
        proc.wait(timeout=10)
        assert not any(_alive(pid) for pid in members)
    finally:
        group.kill()
        group.remove()
    assert not any(d.exists() for d in group.dirs.values())
    assert any("hit the cap of 64 processes" in n for n in isolation_notes(peaks, 64, 512, Path("/nonexistent")))


@needs_cgroups
def test_cgroup_memory_cap_holds_the_whole_group() -> None:
    group = cgroups.Group(PLAN.cgroups, pids_max=64, memory_bytes=256 * 2**20)
    code = "b = bytearray(600 * 2**20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('survived')"
    try:
        proc = subprocess.run(isolation._joiner(group.procs_files("kernel")) + [sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=120)
        assert "survived" not in proc.stdout and proc.returncode == -9, (proc.returncode, proc.stderr[-300:])
        peaks = group.peaks()
        assert peaks["oom_kills"] == 1 and peaks["memory_peak"] >= 250 * 2**20, peaks
    finally:
        group.kill()
        group.remove()


@needs_ns
def test_namespaces_give_a_private_tmp_shm_pts_network_and_pid_space(tmp_path: Path) -> None:
    sub = isolation.Submission(PLAN, pids_max=128, memory_mb=1024, tmp_mb=32, shm_mb=16)
    tag = f"gpulab-test-{os.getpid()}"
    code = f"""
import os, socket, subprocess
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
st = os.statvfs("/tmp"); print("tmp_mb", st.f_blocks * st.f_frsize >> 20)
st = os.statvfs("/dev/shm"); print("shm_mb", st.f_blocks * st.f_frsize >> 20)
print("pts", sorted(os.listdir("/dev/pts")))
print("nics", sorted(n for _, n in socket.if_nameindex()))
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()  # loopback is up (ZMQ and gloo need it)
open("/tmp/{tag}", "w").write("x"); open("/dev/shm/{tag}", "w").write("x")
try:
    open("/dev/shm/{tag}-big", "wb").write(b"x" * 32 * 2**20)
except OSError as err:
    print("shm full:", err.errno)
subprocess.Popen(["sleep", "{os.getpid() % 10000 + 40000}"], start_new_session=True)  # detached: dies with the namespace
"""
    report = tmp_path / "report.json"
    try:
        proc = subprocess.run(sub.wrap([sys.executable, "-c", code], report=report), capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "clone hidden" in proc.stdout and "given: copied in" in proc.stdout, proc.stdout
        assert "disk full: 28" in proc.stdout and "files refused at" in proc.stdout, proc.stdout
        assert (work / "result.ipynb").read_text() == "kept"  # back out of the quota's tmpfs ...
        assert not (tmp / "f1").exists() and (tmp / "given.txt").exists()  # ... the temp folder's files are not
        quota = json.loads(report.read_text())["quota"]
        assert quota[str(tmp)]["files"] >= 990 and quota[str(work)]["cap_mb"] == 16
    finally:
        subprocess.run(["rm", "-rf", str(clone)])
        shutil.rmtree(tmp_path, ignore_errors=True)
