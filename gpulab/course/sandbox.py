"""Grade one submission: nbgrader's own ``autograde``, in an isolated copy of the course, in the
submission's namespaces and cgroup (:mod:`gpulab.confine.isolation`), its kernel started through
``setpriv`` and :mod:`gpulab.confine.jail` and run by :class:`gpulab.course.execute.SandboxedExecute`.

A copy, because parallel autogrades writing one sqlite gradebook fail with "database is locked",
and a notebook must not touch the real course. :mod:`gpulab.course.gradebook` later merges the
copy's scores into the real gradebook, one submission at a time::

    <root>/<lab>/<student>/
        nbgrader_config.py, gradebook.db    the course's config + overrides; the run's snapshot
        source/<lab>/                       the lab's non-notebook files
        submitted/<student>/<lab>/          the submission, checked and repaired (integrity)
        autograded/<student>/<lab>/         where the kernel runs and nbgrader writes
        tmp/                                the kernel's HOME, caches, IPYTHONDIR, MPLCONFIGDIR
        writes.jsonl, nbgrader.log, namespace.json   the jail's log, nbgrader's, what nsinit saw
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpulab.confine import isolation, jail
from gpulab.course import integrity, links, students
from gpulab.course import notes as notes_mod
from gpulab.course.execute import FULL
from gpulab.course.limits import LabRun, Limits, SandboxResult  # re-exported: callers import them from here
from gpulab.course.nbgrader_cli import nbgrader_command, nbgrader_env

_CONFIG_TAIL = """

# ---- appended by gpulab.course.sandbox: an isolated copy of the course for one submission ----
from gpulab.course.execute import swap_execute as _gpulab_swap_execute
c.CourseDirectory.root = {root!r}
c.CourseDirectory.db_url = {db_url!r}
c.Autograde.autograde_preprocessors = _gpulab_swap_execute(c.Autograde.get("autograde_preprocessors"))
c.JailedKernelManager.jail_args = {jail_args!r}
c.JailedKernelManager.kernel_prefix = {kernel_prefix!r}
c.JailedKernelManager.kernel_uid = {kernel_uid!r}
c.JailedKernelManager.audit_log = {audit_log!r}
c.SandboxedExecute.max_output_kb = {max_output_kb!r}
c.SandboxedExecute.interrupt_grace = {grace}
c.SandboxedExecute.clean_dir = {work!r}
c.SandboxedExecute.clean_log = {clean_log!r}
c.SandboxedExecute.mode = "graded"
c.SandboxedExecute.expected = {expected!r}
c.SandboxedExecute.measure_lock = {measure_lock!r}
c.SandboxedExecute.kernel_cgroup = {kernel_cgroup!r}
# The outputs are collected by then; a graceful kernel shutdown only adds about 2 s per submission.
c.Execute.shutdown_kernel = "immediate"
"""
_NBGRADER_FILES = {"gradebook.db", "gradebook.db-journal", "gradebook.db-wal", "gradebook.db-shm",
                   ".nbgrader.log", "nbgrader.log", "writes.jsonl", "nbgrader_config.py", "removed.txt",
                   "namespace.json"}


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


def _apparent_bytes(folders: list[Path], skip: set[str]) -> int:
    """The size of every regular file under ``folders`` (links not followed), but those named in ``skip``."""
    total = 0
    for folder in folders:
        for dirpath, _, filenames in os.walk(folder):
            for name in filenames:
                if name in skip:
                    continue
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def _font_cache() -> list[str]:
    """matplotlib's font list, copied into each sandbox so no kernel rebuilds it (seconds each)."""
    cache = os.environ.get("MPLCONFIGDIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "matplotlib")
    return glob.glob(os.path.join(cache, "fontlist-*.json"))


class SandboxError(RuntimeError):
    """The sandbox is not in force; grading must not go on without it."""


def check_config(path: Path, jail_args: list[str], kernel_prefix: list[str] | None = None) -> None:
    """Load the sandbox's config as nbgrader will, and raise :class:`SandboxError` unless it swaps in
    the sandboxed kernel: nbgrader runs *without* a config that raises, i.e. with no sandbox."""
    from traitlets.config.loader import PyFileConfigLoader

    from gpulab.course.execute import SandboxedExecute

    try:
        config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    except Exception as err:  # any failure means the same: no sandbox
        raise SandboxError(f"{path} does not load ({type(err).__name__}: {err})") from None
    if SandboxedExecute not in config.Autograde.get("autograde_preprocessors", []) or \
            config.JailedKernelManager.get("jail_args") != jail_args or \
            config.JailedKernelManager.get("kernel_prefix", []) != (kernel_prefix or []):
        raise SandboxError(f"{path} does not switch on the sandboxed kernel; check the course's nbgrader_config.py")


def prepare(course: Path, template_db: Path, specs: dict[str, integrity.NotebookSpec], lab: str, student: str,
            box: Path, limits: Limits, sub: isolation.Submission | None = None,
            secrets: list[Path] | None = None, run: LabRun | None = None, real: str | None = None) -> list[str]:
    """Build the isolated course for one submission (``real``: its id when ``student`` is an alias);
    return the integrity notes. Raises UnreadableNotebook, or FileNotFoundError when none of the
    lab's notebooks was submitted (the message is the note)."""
    box.mkdir(parents=True)
    shutil.copyfile(template_db, box / "gradebook.db")
    shutil.copytree(course / "source" / lab, box / "source" / lab,
                    ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints", "__pycache__"))
    submitted = box / "submitted" / student / lab
    skipped = links.copy_regular(course / "submitted" / (real or student) / lab, submitted, limits.max_notebook_mb * 2**20,
                                 max_total=limits.max_submission_mb * 2**20)
    work = box / "autograded" / student / lab
    tmp = box / "tmp"
    for d in (work, tmp / "matplotlib", tmp / "ipython", tmp / "runtime", tmp / "cache", tmp / "home"):
        d.mkdir(parents=True)
    for f in _font_cache():
        shutil.copy(f, tmp / "matplotlib")
    (box / "writes.jsonl").touch()
    if run is not None:
        shutil.copyfile(run.expected, box / "expected.json")
        (box / "expected.json").chmod(0o600)
        if sub is not None:
            sub.binds = [(str(a), str(b)) for a, b in run.binds]
    if sub is not None:
        sub.visible = [str(box.parent.parent)]  # the grading folder; nothing else of the machine but the system
        if run is not None and run.measure_lock:  # the machine-wide lock of measured runs
            sub.visible.append(str(Path(run.measure_lock).parent))
        if sub.plan.namespaces:  # what the kernel writes counts against caps of its own, not the grading disk
            student_dir = box / "autograded" / student
            sub.quotas = [f"{d}:{limits.disk_mb}:{limits.files_max}" for d in (student_dir, tmp)]
            sub.copy_back = [str(student_dir)]
    private_tmp = sub is not None and sub.plan.namespaces
    if sub is not None and sub.uid is not None:
        _hand_over(box, student, sub)
    jail_args = ["--memory-mb", str(limits.memory_mb), "--memory-rlimit", limits.memory_rlimit,
                 "--fsize-mb", str(limits.fsize_mb), "--audit-fd", "{audit_fd}",
                 "--home", str(tmp / "home"), "--oom-first"]
    own = [work, tmp] + ([Path("/tmp")] if private_tmp else [])  # /tmp: the submission's private tmpfs
    if limits.confine_writes:
        jail_args += [a for d in own for a in ("--write", str(d))]
        if private_tmp:  # a checkout or venv under /tmp is bound back read-only (nsinit): say so when written to
            jail_args += [a for d in isolation.kept_under_tmp() for a in ("--no-write", d)]
    if limits.confine_reads:
        unreadable = jail.instructor_files(course, box, template_db) + list(secrets or [])
        for path in unreadable:
            jail_args += ["--no-read", str(path)]
        if sub is not None:  # where they lie in a checkout kept under /tmp, nsinit hides them too
            sub.masks = [str(p) for p in unreadable]
        jail_args += [a for d in own for a in ("--read", str(d))]
    prefix = sub.kernel_prefix() if sub is not None else []
    tail = _CONFIG_TAIL.format(root=str(box), db_url=f"sqlite:///{box / 'gradebook.db'}", jail_args=jail_args,
                               grace=limits.interrupt_grace_s, work=str(work), clean_log=str(box / "removed.txt"),
                               expected=str(box / "expected.json"), kernel_prefix=prefix,
                               audit_log=str(box / "writes.jsonl"),
                               kernel_uid=sub.uid if sub is not None and sub.uid is not None else -1,
                               max_output_kb=limits.max_output_kb,
                               measure_lock=run.measure_lock if run is not None else "",
                               kernel_cgroup=(sub.kernel_cgroup_dirs() or [""])[0] if sub is not None else "")
    if limits.cell_timeout_s is not None:
        tail += f"c.Execute.timeout = {int(limits.cell_timeout_s)}\n"
    (box / "nbgrader_config.py").write_text((course / "nbgrader_config.py").read_text() + tail)
    check_config(box / "nbgrader_config.py", jail_args, prefix)

    found = {p.stem for p in submitted.glob("*.ipynb")}
    notes = [f"the submission held links or special files, not copied: {notes_mod.some(skipped)}"] if skipped else []
    notes += [f"{name}.ipynb is not part of {lab}; ignored" for name in sorted(found - set(specs))]
    missing = sorted(set(specs) - found)
    if len(missing) == len(specs):
        raise FileNotFoundError(f"no {', '.join(m + '.ipynb' for m in missing)} in the submission "
                                f"(found: {', '.join(sorted(found)) or 'nothing'}); scored 0")
    notes += [f"{m}.ipynb is missing; it scores 0" for m in missing]
    for name in sorted(found & set(specs)):
        notes += integrity.repair_notebook(submitted / f"{name}.ipynb", specs[name])
        notes += integrity.scan_notes(integrity.read_notebook(submitted / f"{name}.ipynb"))
    return notes


def _hand_over(box: Path, student: str, sub: isolation.Submission) -> None:
    """For a kernel under a uid of its own: pass through the grading copy to its folders (``--x``),
    own its temp folder, read nothing else there."""
    for d in (box.parent.parent, box.parent, box, box / "autograded", box / "autograded" / student):
        d.chmod(0o711)
    for path in (box / "gradebook.db", box / "submitted", box / "source", box / "expected.json"):
        path.chmod(0o700 if path.is_dir() else 0o600)
    sub.give(box / "tmp")  # the kernel's own folder is handed over by nbgrader's side


# The only variables of the grader's environment nbgrader and the kernel get (tokens, credentials stay out).
# Where CUDA's libraries and tools are found (a cluster's `module load cuda`, a GPU image's driver
# folder) is the machine's, not the student's: without it a graded kernel can lose the GPU, or
# torch.compile its Triton launcher (libcuda, ptxas), while the instructor's own runs have them.
ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_MESSAGES", "TZ", "TERM",
               "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "PYTHONPATH", "VIRTUAL_ENV",
               "KINETO_LOG_LEVEL", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH")


def _env(box: Path, limits: Limits, private_tmp: bool = False, seed: int | None = None) -> dict[str, str]:
    """nbgrader's and the kernel's environment: :data:`ENV_ALLOWED`, and every cache and ``HOME`` in
    the grading copy (``TMPDIR``: the private ``/tmp``, else ``box/tmp``)."""
    tmp = box / "tmp"
    extra = {"GPULAB_SANDBOX": str(box), "HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1", "TMPDIR": "/tmp" if private_tmp else str(tmp),
             "MPLCONFIGDIR": str(tmp / "matplotlib"),
             "IPYTHONDIR": str(tmp / "ipython"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
             # the grader's home may be hidden in the submission's namespace (nsinit.expose): the
             # course's nbgrader_config.py is the configuration, not ~/.jupyter
             "JUPYTER_CONFIG_DIR": str(tmp / "jupyter"), "JUPYTER_DATA_DIR": str(tmp / "jupyter" / "data"),
             "XDG_CACHE_HOME": str(tmp / "cache"), "TRITON_CACHE_DIR": str(tmp / "cache" / "triton"),
             # torch writes its own choice back into os.environ on first use of torch._dynamo, so a
             # grader process that used it would hand /tmp/torchinductor_<user> to every kernel.
             "TORCHINDUCTOR_CACHE_DIR": str(tmp / "cache" / "torchinductor"),
             "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "agg",
             # the kernel sends evidence, not verdicts, on inputs from this run's seed (gpulab.grading.evidence)
             "GPULAB_GRADING": "graded"}
    if seed is not None:
        extra["GPULAB_SEED"] = str(seed)
    if limits.threads:
        extra.update(OMP_NUM_THREADS=str(limits.threads), MKL_NUM_THREADS=str(limits.threads))
    env = {k: v for k, v in nbgrader_env().items() if k in ENV_ALLOWED}
    env.update(extra)
    return env


def run_autograde(box: Path, lab: str, student: str, limits: Limits,
                  cancel: threading.Event | None = None,
                  sub: isolation.Submission | None = None, seed: int | None = None) -> tuple[int | None, bool]:
    """``nbgrader autograde`` in ``box`` under the wall-clock limit, in ``sub``'s namespaces and cgroup;
    every process of the submission is gone on return. (exit status or None if killed, timed out)"""
    private_tmp = sub is not None and sub.plan.namespaces
    cmd = nbgrader_command() + ["autograde", lab, f"--student={student}", "--force"]
    if limits.confine_writes:
        # nbgrader itself writes only in the grading copy: a link the kernel left cannot carry its
        # writes into the course (Landlock; without it, links.remove_unsafe is the only guard)
        extra = (["/tmp"] if private_tmp else []) + (sub.kernel_cgroup_dirs() if sub is not None else [])
        cmd = [sys.executable, "-m", "gpulab.confine.jail", "--write", str(box),
               *[a for d in extra for a in ("--write", d)], "--", *cmd]
    if sub is not None:
        cmd = sub.join_command() + sub.wrap(cmd, report=box / "namespace.json")
    t0 = time.monotonic()
    with open(box / "nbgrader.log", "wb") as log:
        # A session of its own, no terminal: a student's process group signals cannot reach the grader.
        proc = subprocess.Popen(cmd, cwd=box, env=_env(box, limits, private_tmp, seed), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while True:
                try:
                    return proc.wait(timeout=0.5), False
                except subprocess.TimeoutExpired:
                    if time.monotonic() - t0 > limits.wall_s or (cancel is not None and cancel.is_set()):
                        isolation.kill_tree(proc.pid)
                        proc.wait()
                        return None, time.monotonic() - t0 > limits.wall_s
        finally:
            if sub is not None:
                sub.finish()
            if sub is None or not (sub.plan.namespaces or sub.group is not None):
                isolation.kill_marked(str(box))  # no PID namespace, no cgroup: the environment marker is all there is


def read_scores(result: SandboxResult, db_url: str, student: str | None = None) -> None:
    """Copy the auto scores, comments, penalties and timestamp nbgrader saved into ``result``
    (``student``: the name it was graded under, when that is an alias)."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url, course_id="") as gb:
        sub = gb.find_submission(result.lab, student or result.student)
        result.timestamp = sub.timestamp
        for nb in sub.notebooks:
            result.late_penalties[nb.name] = nb.late_submission_penalty
            for g in nb.grades:
                result.grades[(nb.name, g.name)] = g.auto_score
            for c in nb.comments:
                result.comments[(nb.name, c.name)] = c.auto_comment


def grade_in_sandbox(course: Path, template_db: Path, specs: dict[str, integrity.NotebookSpec], lab: str,
                     student: str, box: Path, limits: Limits, cancel: threading.Event | None = None,
                     plan: isolation.Plan | None = None, secrets: list[Path] | None = None,
                     run: LabRun | None = None) -> SandboxResult:
    """Grade one submission in ``box`` (a new folder); never raises for anything the student did.
    ``plan``: this machine's isolation (None: none); ``secrets``: :func:`jail.repository_secrets`;
    ``run``: the lab's reference run and masks (None: every test fails)."""
    t0 = time.perf_counter()
    result = SandboxResult(student, lab, log=box / "nbgrader.log")
    real, student = student, students.alias(student)  # nbgrader sees only the alias
    sub = None
    if plan is not None:
        sub = isolation.Submission(plan, limits.pids_max, limits.cgroup_memory_mb(), limits.tmp_mb, limits.shm_mb)
    try:
        try:
            result.notes += prepare(course, template_db, specs, lab, student, box, limits, sub, secrets, run, real)
        except integrity.UnreadableNotebook as err:
            result.status, result.notes = "unreadable", [str(err)]
            return result
        except FileNotFoundError as err:
            result.status, result.notes = "missing", [str(err)]
            return result
        before = _snapshot(box, [box / "autograded", box / "tmp"])
        rc, timed_out = run_autograde(box, lab, student, limits, cancel, sub, run.seed if run else None)
    finally:
        if sub is not None:
            result.peaks = sub.finish()  # also when prepare failed: no cgroup is left behind
    result.seconds = time.perf_counter() - t0
    result.notes += notes_mod.isolation_notes(result.peaks, limits.pids_max, limits.cgroup_memory_mb(),
                                              box / "namespace.json", limits.tmp_mb, limits.shm_mb)
    return _collect(result, box, student, lab, specs, limits, rc, timed_out, before)


def _collect(result: SandboxResult, box: Path, student: str, lab: str, specs: dict[str, integrity.NotebookSpec],
             limits: Limits, rc: int | None, timed_out: bool, before: dict[str, tuple[int, int]]) -> SandboxResult:
    """Read what the run left: planted files, stray writes, the jail's log, the notebooks' notes, the scores."""
    work = box / "autograded" / student / lab
    planted = links.remove_unsafe(box)  # the kernel's processes are gone: nothing re-plants them now
    if (box / "removed.txt").is_file():  # what nbgrader's SandboxedExecute removed when the kernel stopped
        lines = (box / "removed.txt").read_text().split("\n")[:-1]
        for line in (ln for ln in lines if ln.startswith(FULL)):
            result.notes.append(f"filled its folder (a disk of its own, {limits.disk_mb} MiB and {limits.files_max} "
                                f"files): removed {line[len(FULL):].strip()} so that its notebook could be saved")
        planted = [ln for ln in lines if not ln.startswith(FULL)] + planted
    planted = [p for p in planted if not p.startswith("tmp/")]  # sockets of DataLoader workers, harmless there
    if planted:
        result.notes.append(f"left links or special files in its folder, removed unread: {notes_mod.some(planted)}")
    left = _apparent_bytes([work, box / "tmp"], skip={f"{name}.ipynb" for name in specs})
    if left > limits.max_notebook_mb * 2**20:  # sparse files count at their full size: that is what a copy costs
        result.notes.append(f"left {left / 2**20:.0f} MiB of files in its folders (apparent size); none is kept")
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
    read_scores(result, f"sqlite:///{box / 'gradebook.db'}", student)
    result.autograded = work
    return result


def grade_safely(course: Path, template: Path, specs: dict, lab: str, student: str, box: Path,
                  limits: Limits, cancel: threading.Event, plan: isolation.Plan, secrets: list[Path],
                  run: LabRun) -> SandboxResult:
    try:
        return grade_in_sandbox(course, template, specs, lab, student, box, limits, cancel, plan, secrets, run)
    except Exception as err:  # a grader bug on one submission must not stop the class
        return SandboxResult(student, lab, status="failed", notes=[f"grader error: {type(err).__name__}: {err}"])


def grading_root(private_tmp: bool) -> Path:
    """A new folder for the run's grading copies (``/var/tmp`` when each submission's private ``/tmp``
    would hide it)."""
    parent = Path(tempfile.gettempdir())
    if private_tmp and parent.resolve().is_relative_to("/tmp"):
        parent = Path("/var/tmp")
    root = Path(tempfile.mkdtemp(prefix="gpulab-grade-", dir=parent))
    root.chmod(0o711)  # a kernel under a uid of its own passes through to its own folder, lists nothing
    return root
