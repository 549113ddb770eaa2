"""gpulab.confine.isolation, cgroups and nsinit: each submission's namespaces, cgroup and kernel uid,
tried for real on this machine (root on Linux here and in CI); the refusal, flag and note where a
layer is missing; and, without them, the kill by process tree and by the GPULAB_SANDBOX marker."""

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

from gpulab.autograde.notes import isolation_notes
from gpulab.confine import cgroups, isolation
from gpulab.confine.isolation import kill_marked, kill_tree

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
    finally:
        peaks = sub.finish()
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "pids [1, 2]" in out and "tmp_mb 32" in out and "shm_mb 16" in out and "shm full: 28" in out
    assert "pts ['ptmx']" in out and "nics ['lo']" in out
    assert not Path(f"/tmp/{tag}").exists() and not Path(f"/dev/shm/{tag}").exists()
    assert not any(p.info["cmdline"] == ["sleep", str(os.getpid() % 10000 + 40000)]
                   for p in psutil.process_iter(["cmdline"]))
    left = json.loads(report.read_text())
    assert left["left_running"] == ["sleep"] and left["shm_used_mb"] >= 15
    notes = isolation_notes(peaks, 128, 1024, report, tmp_mb=32, shm_mb=16)
    assert any("filled its private /dev/shm" in n for n in notes)
    assert any("1 process(es) it started outlived its kernel (sleep)" in n for n in notes)


@needs_ns
def test_a_checkout_under_tmp_stays_reachable_and_nothing_else_of_tmp(tmp_path: Path) -> None:
    """A clone (and its venv) under /tmp: the private /tmp binds it back, read-only, with what no kernel
    may read (the course, .git) masked in it; a classmate's file beside it is not there. A command that cannot start says why (it was exit 127 and no message)."""
    assert str(tmp_path.resolve()).startswith("/tmp/"), "pytest's tmp_path is expected under /tmp"
    kept, beside = tmp_path / "checkout", tmp_path / "beside.txt"
    (kept / "notebooks" / "source").mkdir(parents=True)
    (kept / "inside.txt").write_text("kept")
    (kept / "notebooks" / "source" / "answers.txt").write_text("secret")
    (kept / "HEAD").write_text("secret")
    beside.write_text("secret")
    init = [sys.executable, "-m", "gpulab.confine.nsinit", "--tmp-mb", "16", "--shm-mb", "16", *isolation._keep_args(isolation.kernel_paths()),
            "--keep", str(kept), "--mask", str(kept / "notebooks"), "--mask", str(kept / "HEAD"), "--mask", "/var/nope"]
    code = f"""import os
try:
    open({str(kept / 'new.txt')!r}, "w")
    written = "written"
except OSError as err:
    written = os.strerror(err.errno).replace(" ", "-")
print(open({str(kept / 'inside.txt')!r}).read(), os.path.exists({str(beside)!r}), written,
      os.listdir({str(kept / 'notebooks')!r}), repr(open({str(kept / 'HEAD')!r}).read()))"""
    unshare = ["unshare", *isolation._unshare_flags(PLAN.root), "--"]
    proc = subprocess.run([*unshare, *init, "--", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["kept", "False", "Read-only-file-system", "[]", "''"], \
        (proc.stdout, proc.stderr)  # the masked course folder and file: empty to any program, cat included
    assert not (kept / "new.txt").exists()
    proc = subprocess.run([*unshare, *init, "--", str(tmp_path / "no-such-python")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 127 and "cannot start" in proc.stderr and "no-such-python" in proc.stderr, proc.stderr


@needs_root
def test_the_kernel_runs_under_an_unused_uid_with_no_capabilities_and_cannot_type_into_a_terminal() -> None:
    sub = isolation.Submission(PLAN, pids_max=128, memory_mb=0, tmp_mb=32, shm_mb=32)
    master, slave = os.openpty()
    tty.setraw(slave)  # a keystroke is readable at once, without a newline
    code = f"""
import fcntl, os, termios
print("uid", os.getuid(), os.getgid(), os.getgroups())
print([line for line in open("/proc/self/status") if line.startswith("CapEff")][0].split()[1])
try:
    fd = os.open({os.ttyname(slave)!r}, os.O_RDONLY | os.O_NOCTTY)
    fcntl.ioctl(fd, termios.TIOCSTI, b"x")
    print("TYPED")
except OSError as err:
    print("refused", err.errno)
"""
    try:
        prefix = sub.kernel_prefix()
        assert "setpriv" in prefix
        proc = subprocess.run(prefix + [sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        # the same attack as root, with no prefix: typed (so the check above can fail)
        root = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        sub.finish()
    assert f"uid {sub.uid} {sub.uid} []" in proc.stdout and sub.uid in isolation.KERNEL_UIDS, proc.stdout + proc.stderr
    assert "0000000000000000" in proc.stdout and "TYPED" not in proc.stdout and "refused" in proc.stdout
    assert "TYPED" in root.stdout
    os.set_blocking(slave, False)
    assert os.read(slave, 10) == b"x"  # root's keystroke, and only it
    with pytest.raises(BlockingIOError):
        os.read(slave, 10)
    os.close(master)
    os.close(slave)


def _weak(plan: isolation.Plan) -> isolation.Plan:
    """This machine's plan, with the user namespaces, the kernel's uid and the cgroups taken away."""
    return replace(plan, namespaces=False, why_not_namespaces="unshare failed: simulated", kernel_uid=False,
                   cgroups=cgroups.Support(why_not={"pids.max": "simulated", "memory": "simulated"}))


def test_a_missing_layer_is_named_in_the_refusal_with_the_flag() -> None:
    weak = _weak(PLAN)
    names = [layer.name for layer in weak.off()]
    assert names[:4] == ["kernel identity", "namespaces", "cgroup limits", "whole-group kill"]
    text = weak.refusal()
    assert "namespaces: unshare failed: simulated" in text and "ALLOW_WEAKER_SANDBOX=1" in text
    assert "--allow-weaker-sandbox" in text
    assert weak.note().startswith("graded with weaker isolation: kernel identity off")
    assert PLAN.note() == "" or PLAN.off()  # the full plan adds no note


@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_make_grade_refuses_a_weaker_sandbox_unless_allowed_and_notes_it(tmp_path: Path, monkeypatch, capsys) -> None:
    import csv
    import shutil

    from conftest import COURSE

    from gpulab.autograde import gradebook
    from gpulab.autograde.__main__ import main as course_main
    from gpulab.course.release import release

    shutil.copytree(COURSE / "source", tmp_path / "source")
    shutil.copy(COURSE / "nbgrader_config.py", tmp_path)
    release(tmp_path, "00_setup")
    shutil.copytree(tmp_path / "source" / "00_setup", tmp_path / "submitted" / "alice" / "00_setup")
    monkeypatch.setattr(isolation, "detect", lambda *a, **k: _weak(PLAN))
    args = ["--course", str(tmp_path), "--lab", "00_setup", "--jobs", "1", "--quiet"]
    assert course_main(args) == 2
    out, err = capsys.readouterr()
    assert "OFF  namespaces: unshare failed: simulated" in out and "--allow-weaker-sandbox" in err
    assert not (tmp_path / "grades.csv").exists()
    t0 = time.monotonic()
    assert course_main(args + ["--allow-weaker-sandbox"]) == 0
    out, _ = capsys.readouterr()
    with open(tmp_path / "grades.csv") as fh:
        [row] = list(csv.DictReader(fh))
    manual = gradebook.manual_points(tmp_path, "00_setup", "alice")  # the written answer waits for the instructor
    assert manual > 0 and float(row["score"]) == float(row["max_score"]) - manual > 0, (row, time.monotonic() - t0)
    assert f"{manual:g} point(s) of written answers wait" in row["notes"]
    assert "graded with weaker isolation: kernel identity off" in row["notes"] and "cgroup limits off" in row["notes"]
    assert "graded with weaker isolation" in out


@needs_ns
def test_the_rest_of_the_machine_is_hidden_and_the_folders_have_quotas() -> None:
    """In a submission's namespaces only the system, this Python, gpulab and the grading folder are
    there: a second clone of the course elsewhere is not. What the kernel writes in its folders
    counts against a size and a file cap of their own, and the folder given to --copy-back comes
    back out once the command ends."""
    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="gpulab-quota-", dir="/var/tmp"))  # where grade puts its folders
    elsewhere = Path("/opt") if os.access("/opt", os.W_OK) else Path.home()
    clone = elsewhere / f"gpulab-clone-test-{os.getpid()}"
    (clone / "notebooks").mkdir(parents=True)
    (clone / "notebooks" / "answers.ipynb").write_text("BEGIN SOLUTION")
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    for d in (work, tmp):
        d.mkdir()
    (tmp / "given.txt").write_text("copied in")
    report = tmp_path / "ns.json"
    code = f"""
import os
print("clone seen" if os.path.exists({str(clone)!r}) else "clone hidden")
print("given:", open({str(tmp / "given.txt")!r}).read())
try:
    with open({str(work / "big.bin")!r}, "wb") as fh:
        for _ in range(64):
            fh.write(b"x" * 2**20)
except OSError as err:
    print("disk full:", err.errno)
os.remove({str(work / "big.bin")!r})  # room for the result (the grader's own _make_room does this for nbgrader)
with open({str(work / "sparse.bin")!r}, "wb") as fh:
    fh.truncate(200 * 2**20)  # holds nothing on the tmpfs; too big to be copied out
for i in range(5000):
    try:
        open(f"{str(tmp)}/f{{i}}", "w").close()
    except OSError as err:
        print("files refused at", i)
        break
open({str(work / "result.ipynb")!r}, "w").write("kept")
"""
    sub = isolation.Submission(replace(PLAN, cgroups=cgroups.Support()), pids_max=256, memory_mb=0, tmp_mb=16,
                               shm_mb=16, visible=[str(tmp_path)], quotas=[f"{work}:16:1000", f"{tmp}:16:1000"],
                               copy_back=[str(work)])
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
        assert not (work / "sparse.bin").exists() and quota[str(work)]["not_copied"] == {"files": 1, "apparent_mb": 200}
    finally:
        subprocess.run(["rm", "-rf", str(clone)])
        shutil.rmtree(tmp_path, ignore_errors=True)


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
