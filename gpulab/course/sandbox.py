"""Autograde one submission with nbgrader's own ``autograde``, in an isolated copy of the course,
under a wall-clock limit, a memory limit and a per-cell timeout.

Why a copy: parallel ``nbgrader autograde`` processes writing one sqlite gradebook fail with
"database is locked", and a student's notebook should not be able to touch the real course. Each
submission gets a folder of its own::

    <root>/<lab>/<student>/
        nbgrader_config.py    the course's config + the overrides below
        gradebook.db          a snapshot of the real gradebook (taken once per run)
        source/<lab>/         the lab's non-notebook files (no solutions)
        submitted/<student>/<lab>/   the submission, checked and repaired (gpulab.course.integrity)
        autograded/<student>/<lab>/  written by nbgrader; the kernel runs (and may write) here
        tmp/                  the kernel's TMPDIR, MPLCONFIGDIR, IPYTHONDIR, caches
        writes.jsonl          writes the jail refused; nbgrader.log  nbgrader's output

The kernel starts through :mod:`gpulab.course.jail` (memory rlimit, Landlock, audit hook) and
runs under :class:`gpulab.course.execute.SandboxedExecute`. The scores stay in the copy's
gradebook until :mod:`gpulab.course.gradebook` merges them, one submission at a time, into the
real one, which stays nbgrader's source of truth (formgrader, ``nbgrader export``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.course import integrity, links, scan
from gpulab.course import notes as notes_mod
from gpulab.course.nbgrader_cli import nbgrader_command, nbgrader_env
from gpulab.course.processes import kill_marked, kill_tree


@dataclass
class Limits:
    """What one submission may use. ``make grade`` sets them from WALL_TIMEOUT, CELL_TIMEOUT,
    MEMORY_MB (see docs/instructor.md).

    Attributes:
        wall_s: wall-clock seconds for the whole autograde of one submission.
        cell_timeout_s: seconds per cell; None keeps ``c.Execute.timeout`` of nbgrader_config.py.
        memory_mb: memory cap of the kernel (and each process it starts), MiB; 0 = none.
        memory_rlimit: "data" (RLIMIT_DATA, what code allocates) or "as" (RLIMIT_AS, address space).
        fsize_mb: largest file the kernel may write, MiB; 0 = none.
        threads: OMP/MKL threads per kernel; None = all (the grader sets cores // jobs).
        interrupt_grace_s: seconds a kernel has to stop after a cell times out before it is killed.
        confine_writes: refuse writes outside the submission's folder and its temp folder.
        confine_reads: refuse reading the instructor's files: the course folder (solutions, hidden
            tests, other students' work, the gradebook), the sandbox's gradebook copies and every
            other submission's grading copy.
        max_notebook_mb: largest notebook (or other file) copied from a submission, or back from
            its grading copy, MiB.
        flagged: "note" (default): code only tampering needs (:mod:`gpulab.course.scan`) gets a
            note; "zero": the test cells after the first flagged cell also score 0.
        probes: snapshot the tests' tools and run a canary after each test cell
            (:mod:`gpulab.course.tamper`).
    """

    wall_s: float = 900.0
    cell_timeout_s: int | None = None
    memory_mb: int = 4096
    memory_rlimit: str = "data"
    fsize_mb: int = 1024
    threads: int | None = None
    interrupt_grace_s: int = 10
    confine_writes: bool = True
    confine_reads: bool = True
    max_notebook_mb: int = 100
    flagged: str = "note"
    probes: bool = True

    def __post_init__(self) -> None:
        if self.wall_s <= 0:
            raise ValueError(f"wall_s={self.wall_s}: the wall-clock limit must be positive (e.g. 900)")
        if self.cell_timeout_s is not None and self.cell_timeout_s <= 0:
            raise ValueError(f"cell_timeout_s={self.cell_timeout_s}: use a positive number of seconds, or None "
                             "for nbgrader_config.py's c.Execute.timeout")
        if self.memory_mb < 0 or 0 < self.memory_mb < 256:
            raise ValueError(f"memory_mb={self.memory_mb}: a kernel that imports torch needs at least 256 MiB "
                             "(0 turns the limit off)")
        if self.memory_rlimit not in ("data", "as"):
            raise ValueError(f"memory_rlimit={self.memory_rlimit!r}: use 'data' or 'as'")
        if self.flagged not in ("note", "zero"):
            raise ValueError(f"flagged={self.flagged!r}: use 'note' (flag only) or 'zero' (the tests after it score 0)")
        if self.max_notebook_mb < 1:
            raise ValueError(f"max_notebook_mb={self.max_notebook_mb}: use at least 1 MiB")


@dataclass
class SandboxResult:
    """What grading one submission produced, before it is merged into the real gradebook."""

    student: str
    lab: str
    status: str = "graded"  # graded | unreadable | missing | failed | timeout
    notes: list[str] = field(default_factory=list)
    grades: dict[tuple[str, str], float | None] = field(default_factory=dict)  # (notebook, cell) -> auto score
    comments: dict[tuple[str, str], str | None] = field(default_factory=dict)
    late_penalties: dict[str, float | None] = field(default_factory=dict)
    timestamp: object = None
    autograded: Path | None = None
    log: Path | None = None
    seconds: float = 0.0
    landlock: bool | None = None


_CONFIG_TAIL = """

# ---- appended by gpulab.course.sandbox: an isolated copy of the course for one submission ----
from gpulab.course.execute import swap_execute as _gpulab_swap_execute
c.CourseDirectory.root = {root!r}
c.CourseDirectory.db_url = {db_url!r}
c.Autograde.autograde_preprocessors = _gpulab_swap_execute(c.Autograde.get("autograde_preprocessors"))
c.JailedKernelManager.jail_args = {jail_args!r}
c.SandboxedExecute.interrupt_grace = {grace}
c.SandboxedExecute.clean_dir = {work!r}
c.SandboxedExecute.clean_log = {clean_log!r}
c.SandboxedExecute.flagged = {flagged!r}
c.SandboxedExecute.probes = {probes!r}
# The outputs are collected by then; a graceful kernel shutdown only adds about 2 s per submission.
c.Execute.shutdown_kernel = "immediate"
"""
_NBGRADER_FILES = {"gradebook.db", "gradebook.db-journal", "gradebook.db-wal", "gradebook.db-shm",
                   ".nbgrader.log", "nbgrader.log", "writes.jsonl", "nbgrader_config.py", "removed.txt"}


def _snapshot(root: Path, skip: list[Path]) -> dict[str, tuple[int, int]]:
    """Size and mtime of every file under ``root`` except those under ``skip``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        for name in filenames:
            p = d / name
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _font_cache() -> list[str]:
    """matplotlib's font list, copied into each sandbox so no kernel rebuilds it (seconds each)."""
    cache = os.environ.get("MPLCONFIGDIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "matplotlib")
    return glob.glob(os.path.join(cache, "fontlist-*.json"))


class SandboxError(RuntimeError):
    """The sandbox is not in force; grading must not go on without it."""


def check_config(path: Path, jail_args: list[str]) -> None:
    """Load the sandbox's config as nbgrader will, and check it swaps in the sandboxed kernel.

    nbgrader logs an exception in ``nbgrader_config.py`` and then runs *without* the file, which
    here would mean an unconfined kernel writing into the real course: fail closed instead.

    Raises:
        SandboxError: the config does not load, or does not set up the sandbox.
    """
    from traitlets.config.loader import PyFileConfigLoader

    from gpulab.course.execute import SandboxedExecute

    try:
        config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    except Exception as err:  # noqa: BLE001 - any failure means the same: no sandbox
        raise SandboxError(f"{path} does not load ({type(err).__name__}: {err})") from None
    if SandboxedExecute not in config.Autograde.get("autograde_preprocessors", []) or \
            config.JailedKernelManager.get("jail_args") != jail_args:
        raise SandboxError(f"{path} does not switch on the sandboxed kernel; check the course's nbgrader_config.py")


def instructor_files(course: Path, box: Path, template_db: Path) -> list[Path]:
    """What a student's kernel must not read: the whole course folder (a kernel needs nothing in it),
    and the gradebooks and source folder of the sandbox (the gradebook holds the hidden tests)."""
    course, box = course.resolve(), box.resolve()
    if box.is_relative_to(course):  # a sandbox inside the course: keep the kernel's own folder readable
        inside = [course / n for n in ("source", "submitted", "autograded", "feedback", "grading_logs")]
        inside += list(course.glob("gradebook.db*"))
    else:
        inside = [course]
    # the grading folder: other students' copies (their connection files, gradebooks), own gradebook
    # and source; the kernel's own folders beneath it are granted back (``--read``)
    return inside + [template_db.resolve(), box.parent.parent]


def prepare(course: Path, template_db: Path, specs: dict[str, integrity.NotebookSpec], lab: str, student: str,
            box: Path, limits: Limits) -> list[str]:
    """Build the isolated course for one submission; return integrity notes.

    Raises:
        integrity.UnreadableNotebook: a submitted notebook cannot be opened.
        FileNotFoundError: none of the lab's notebooks was submitted (the message is the note).
    """
    box.mkdir(parents=True)
    shutil.copyfile(template_db, box / "gradebook.db")
    shutil.copytree(course / "source" / lab, box / "source" / lab,
                    ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints", "__pycache__"))
    sub = box / "submitted" / student / lab
    skipped = links.copy_regular(course / "submitted" / student / lab, sub, limits.max_notebook_mb * 2**20)
    work = box / "autograded" / student / lab
    tmp = box / "tmp"
    for d in (work, tmp / "matplotlib", tmp / "ipython", tmp / "runtime", tmp / "cache"):
        d.mkdir(parents=True)
    for f in _font_cache():
        shutil.copy(f, tmp / "matplotlib")
    jail_args = ["--memory-mb", str(limits.memory_mb), "--memory-rlimit", limits.memory_rlimit,
                 "--fsize-mb", str(limits.fsize_mb), "--audit-log", str(box / "writes.jsonl")]
    if limits.confine_writes:
        jail_args += ["--write", str(work), "--write", str(tmp)]
    if limits.confine_reads:
        for path in instructor_files(course, box, template_db):
            jail_args += ["--no-read", str(path)]
        jail_args += ["--read", str(work), "--read", str(tmp)]
    tail = _CONFIG_TAIL.format(root=str(box), db_url=f"sqlite:///{box / 'gradebook.db'}", jail_args=jail_args,
                               grace=limits.interrupt_grace_s, work=str(work), clean_log=str(box / "removed.txt"),
                               flagged=limits.flagged,
                               probes=limits.probes)
    if limits.cell_timeout_s is not None:
        tail += f"c.Execute.timeout = {int(limits.cell_timeout_s)}\n"
    (box / "nbgrader_config.py").write_text((course / "nbgrader_config.py").read_text() + tail)
    check_config(box / "nbgrader_config.py", jail_args)

    found = {p.stem for p in sub.glob("*.ipynb")}
    notes = [f"the submission held links or special files, not copied: {notes_mod.some(skipped)}"] if skipped else []
    notes += [f"{name}.ipynb is not part of {lab}; ignored" for name in sorted(found - set(specs))]
    missing = sorted(set(specs) - found)
    if len(missing) == len(specs):
        raise FileNotFoundError(f"no {', '.join(m + '.ipynb' for m in missing)} in the submission "
                                f"(found: {', '.join(sorted(found)) or 'nothing'}); scored 0")
    notes += [f"{m}.ipynb is missing; it scores 0" for m in missing]
    for name in sorted(found & set(specs)):
        notes += integrity.repair_notebook(sub / f"{name}.ipynb", specs[name])
        notes += scan.scan_notes(integrity.read_notebook(sub / f"{name}.ipynb"), limits.flagged)
    return notes


def _env(box: Path, limits: Limits) -> dict[str, str]:
    tmp = box / "tmp"
    extra = {"GPULAB_SANDBOX": str(box), "TMPDIR": str(tmp), "MPLCONFIGDIR": str(tmp / "matplotlib"),
             "IPYTHONDIR": str(tmp / "ipython"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
             "XDG_CACHE_HOME": str(tmp / "cache"), "TRITON_CACHE_DIR": str(tmp / "cache" / "triton"),
             # torch writes its own choice back into os.environ on first use of torch._dynamo, so a
             # grader process that used it would hand /tmp/torchinductor_<user> to every kernel.
             "TORCHINDUCTOR_CACHE_DIR": str(tmp / "cache" / "torchinductor"),
             "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "agg"}
    if limits.threads:
        extra.update(OMP_NUM_THREADS=str(limits.threads), MKL_NUM_THREADS=str(limits.threads))
    return nbgrader_env(extra)


def run_autograde(box: Path, lab: str, student: str, limits: Limits,
                  cancel: threading.Event | None = None) -> tuple[int | None, bool]:
    """``nbgrader autograde`` in ``box`` under the wall-clock limit.

    Returns:
        (exit status or None when killed, whether the wall-clock limit was hit).
    """
    cmd = nbgrader_command() + ["autograde", lab, "--student", student, "--force"]
    if limits.confine_writes:
        # nbgrader itself writes only in the grading copy: a link the kernel left cannot carry its
        # writes into the course (Landlock; without it, links.remove_unsafe is the only guard)
        cmd = [sys.executable, "-m", "gpulab.course.jail", "--write", str(box), "--", *cmd]
    t0 = time.monotonic()
    with open(box / "nbgrader.log", "wb") as log:
        # A session of its own: a student's process group signals cannot reach the grader.
        proc = subprocess.Popen(cmd, cwd=box, env=_env(box, limits), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while True:
                try:
                    return proc.wait(timeout=0.5), False
                except subprocess.TimeoutExpired:
                    if time.monotonic() - t0 > limits.wall_s or (cancel is not None and cancel.is_set()):
                        kill_tree(proc.pid)
                        proc.wait()
                        return None, time.monotonic() - t0 > limits.wall_s
        finally:
            kill_marked(str(box))


def read_scores(result: SandboxResult, db_url: str) -> None:
    """Copy the auto scores, comments, penalties and timestamp nbgrader saved into ``result``."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url, course_id="") as gb:
        sub = gb.find_submission(result.lab, result.student)
        result.timestamp = sub.timestamp
        for nb in sub.notebooks:
            result.late_penalties[nb.name] = nb.late_submission_penalty
            for g in nb.grades:
                result.grades[(nb.name, g.name)] = g.auto_score
            for c in nb.comments:
                result.comments[(nb.name, c.name)] = c.auto_comment


def grade_in_sandbox(course: Path, template_db: Path, specs: dict[str, integrity.NotebookSpec], lab: str,
                     student: str, box: Path, limits: Limits, cancel: threading.Event | None = None) -> SandboxResult:
    """Grade one submission in ``box`` (a new folder); never raises for anything the student did."""
    t0 = time.perf_counter()
    result = SandboxResult(student, lab, log=box / "nbgrader.log")
    try:
        result.notes += prepare(course, template_db, specs, lab, student, box, limits)
    except integrity.UnreadableNotebook as err:
        result.status, result.notes = "unreadable", [str(err)]
        return result
    except FileNotFoundError as err:
        result.status, result.notes = "missing", [str(err)]
        return result
    work = box / "autograded" / student / lab
    before = _snapshot(box, [box / "autograded", box / "tmp"])
    rc, timed_out = run_autograde(box, lab, student, limits, cancel)
    result.seconds = time.perf_counter() - t0
    planted = links.remove_unsafe(box)  # the kernel's processes are gone: nothing re-plants them now
    if (box / "removed.txt").is_file():  # what nbgrader's SandboxedExecute removed when the kernel stopped
        planted = (box / "removed.txt").read_text().split("\n")[:-1] + planted
    planted = [p for p in planted if not p.startswith("tmp/")]  # sockets of DataLoader workers, harmless there
    if planted:
        result.notes.append(f"left links or special files in its folder, removed unread: {notes_mod.some(planted)}")
    after = _snapshot(box, [work, box / "tmp"])
    strays = sorted(p for p, st in after.items() if before.get(p) != st and p not in _NBGRADER_FILES)
    result.landlock, refused, reads = notes_mod.read_write_log(box / "writes.jsonl")
    # the grading copy is deleted afterwards: name it, not its temporary path
    refused, reads = ([p.replace(str(box), "<grading copy>") for p in paths] for paths in (refused, reads))
    result.notes += notes_mod.write_notes(refused, strays, reads)
    if timed_out:
        result.status = "timeout"
        result.notes.append(f"ran past the {limits.wall_s:g} s wall-clock limit and was stopped; scored 0")
        return result
    # Other *.ipynb files a kernel left in its folder (empty, broken) would be read, merged into the
    # course and fed to nbgrader's feedback as if they were part of the lab: drop them here, once.
    for stray in work.glob("*.ipynb"):
        if stray.stem not in specs:
            stray.unlink()
    notebooks = sorted(work.glob("*.ipynb"))
    if result.landlock is None and notebooks:
        # The kernel never went through the jail (it logs its start first thing): do not trust this run.
        result.status = "failed"
        result.notes.append("grader error: the kernel ran without the sandbox (see nbgrader.log); scored 0, "
                            "regrade after fixing the course's nbgrader_config.py")
        return result
    if rc != 0 or not notebooks:
        result.status = "failed"
        reason = "cancelled" if rc is None else notes_mod.last_error(box / "nbgrader.log")
        result.notes.append(f"autograde failed: {reason}; scored 0")
        return result
    for nb in notebooks:
        result.notes += notes_mod.output_notes(nb, limits.cell_timeout_s, limits.memory_mb)
    read_scores(result, f"sqlite:///{box / 'gradebook.db'}")
    result.autograded = work
    return result
