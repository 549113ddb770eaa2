"""The sandbox of one submission: an isolated copy of the course (the box), its jail, its mounts.

A copy, because parallel autogrades writing one sqlite gradebook fail with "database is locked",
and a notebook must not touch the real course. :mod:`gpulab.autograde.gradebook` later merges the
copy's scores into the real gradebook, one submission at a time::

    <root>/<lab>/<student>/
        nbgrader_config.py                  the course's config, as it is
        nbgrader_config.json                the sandbox's settings (data, read after the .py)
        gradebook.db                        the run's snapshot
        source/<lab>/                       the lab's non-notebook files
        submitted/<student>/<lab>/          the submission, checked and repaired (integrity)
        autograded/<student>/<lab>/         where the kernel runs and nbgrader writes
        tmp/                                the kernel's HOME, caches, IPYTHONDIR, MPLCONFIGDIR
        writes.jsonl, nbgrader.log, namespace.json   the jail's log, nbgrader's, what nsinit saw

The submission then runs in its namespaces and cgroup (:mod:`gpulab.autograde.box.run`), its kernel
started through ``setpriv`` and :mod:`gpulab.confine.jail` by
:class:`gpulab.autograde.execute.kernel.JailedKernelManager`.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gpulab.autograde import notes as notes_mod
from gpulab.autograde.box import integrity, links
from gpulab.autograde.execute.config import EXECUTE, autograde_preprocessors, write_box_config
from gpulab.autograde.limits import LabRun, Limits
from gpulab.confine import cuda_paths, isolation, jail


def font_cache() -> list[str]:
    """matplotlib's font list, copied into each sandbox so no kernel rebuilds it (seconds each)."""
    cache = os.environ.get("MPLCONFIGDIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "matplotlib")
    return glob.glob(os.path.join(cache, "fontlist-*.json"))


def _copy_in(course: Path, template_db: Path, lab: str, student: str, box: Path, limits: Limits,
             real: str | None) -> list[str]:
    """The box's folders and files; returns what of the submission was not copied (links, devices)."""
    box.mkdir(parents=True)
    shutil.copyfile(template_db, box / "gradebook.db")
    shutil.copytree(course / "source" / lab, box / "source" / lab,
                    ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints", "__pycache__"))
    skipped = links.copy_regular(course / "submitted" / (real or student) / lab, box / "submitted" / student / lab,
                                 limits.max_notebook_mb * 2**20, max_total=limits.max_submission_mb * 2**20)
    tmp = box / "tmp"
    for d in (box / "autograded" / student / lab, tmp / "matplotlib", tmp / "ipython", tmp / "runtime",
              tmp / "cache", tmp / "home"):
        d.mkdir(parents=True)
    for f in font_cache():
        shutil.copy(f, tmp / "matplotlib")
    (box / "writes.jsonl").touch()
    shutil.copyfile(course / "nbgrader_config.py", box / "nbgrader_config.py")
    return skipped


def _mounts(box: Path, student: str, limits: Limits, sub: isolation.Submission, run: LabRun | None) -> None:
    """What nsinit binds, shows and caps for this submission."""
    if run is not None:
        sub.binds = [(str(a), str(b)) for a, b in run.binds]
    sub.visible = [str(box.parent.parent)]  # the grading folder; nothing else of the machine but the system
    cuda = cuda_paths.machine()
    if cuda.present:  # a GPU machine: its driver's and CUDA's folders, as the reference run sees them
        sub.see, sub.groups = cuda.folders, cuda.groups
    if run is not None and run.measure_lock:  # the machine-wide lock of measured runs
        sub.visible.append(str(Path(run.measure_lock).parent))
    if sub.plan.namespaces:  # what the kernel writes counts against caps of its own, not the grading disk
        student_dir = box / "autograded" / student
        sub.quotas = [f"{d}:{limits.disk_mb}:{limits.files_max}" for d in (student_dir, box / "tmp")]
        sub.copy_back = [str(student_dir)]
    if sub.uid is not None:
        _hand_over(box, student, sub)


def memory_args(limits: Limits) -> list[str]:
    """The jail's memory and file-size caps of a graded kernel, and of the reference run's kernel: on
    a GPU machine no data rlimit (a CUDA context does not fit in one; the cgroup caps the submission)."""
    mb = cuda_paths.kernel_memory_mb(limits.memory_mb, cuda_paths.machine().present)
    return ["--memory-mb", str(mb), "--memory-rlimit", limits.memory_rlimit, "--fsize-mb", str(limits.fsize_mb)]


def _jail_args(course: Path, template_db: Path, box: Path, work: Path, limits: Limits,
               sub: isolation.Submission | None, secrets: list[Path] | None) -> list[str]:
    """The arguments of ``python -m gpulab.confine.jail`` for the kernel."""
    tmp, private_tmp = box / "tmp", sub is not None and sub.plan.namespaces
    args = [*memory_args(limits), "--audit-fd", "{audit_fd}", "--home", str(tmp / "home"), "--oom-first"]
    own = [work, tmp] + ([Path("/tmp")] if private_tmp else [])  # /tmp: the submission's private tmpfs
    if limits.confine_writes:
        args += [a for d in own for a in ("--write", str(d))]
        if private_tmp:  # a checkout or venv under /tmp is bound back read-only (nsinit): say so when written to
            args += [a for d in isolation.kept_under_tmp() for a in ("--no-write", d)]
    if limits.confine_reads:
        unreadable = jail.instructor_files(course, box, template_db) + list(secrets or [])
        for path in unreadable:
            args += ["--no-read", str(path)]
        if sub is not None:  # where they lie in a checkout kept under /tmp, nsinit hides them too
            sub.masks = [str(p) for p in unreadable]
        args += [a for d in own for a in ("--read", str(d))]
    return args


def box_settings(course: Path, box: Path, work: Path, limits: Limits, jail_args: list[str], prefix: list[str],
                 sub: isolation.Submission | None, run: LabRun | None) -> dict[str, dict[str, Any]]:
    """The sandbox's nbgrader settings, as data."""
    execute: dict[str, Any] = {
        "mode": "graded", "expected": str(box / "expected.json"), "max_output_kb": limits.max_output_kb,
        "interrupt_grace": limits.interrupt_grace_s, "clean_dir": str(work), "clean_log": str(box / "removed.txt"),
        "measure_lock": run.measure_lock if run is not None else "",
        "kernel_cgroup": (sub.kernel_cgroup_dirs() or [""])[0] if sub is not None else "",
        "kernel_manager_class": "gpulab.autograde.execute.kernel.JailedKernelManager"}
    settings = {
        "CourseDirectory": {"root": str(box), "db_url": f"sqlite:///{box / 'gradebook.db'}"},
        "Autograde": {"autograde_preprocessors": autograde_preprocessors(_course_steps(course))},
        "GpulabExecute": execute,
        "JailedKernelManager": {"jail_args": jail_args, "kernel_prefix": prefix, "audit_log": str(box / "writes.jsonl"),
                                "kernel_uid": sub.uid if sub is not None and sub.uid is not None else -1},
        # the outputs are collected by then; a graceful kernel shutdown only adds about 2 s per submission
        "Execute": {"shutdown_kernel": "immediate"}}
    if limits.cell_timeout_s is not None:
        settings["Execute"]["timeout"] = int(limits.cell_timeout_s)
    return settings


def _course_steps(course: Path) -> list[Any] | None:
    """The course's own ``c.Autograde.autograde_preprocessors``, if its nbgrader_config.py sets them."""
    config = _load(course / "nbgrader_config.py")
    return list(config.Autograde.autograde_preprocessors) if "autograde_preprocessors" in config.Autograde else None


def _load(path: Path) -> Any:
    from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

    config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    json_file = path.with_suffix(".json")
    if json_file.exists():
        config.merge(JSONFileConfigLoader(json_file.name, path=str(path.parent)).load_config())
    return config


class SandboxError(RuntimeError):
    """The sandbox is not in force; grading must not go on without it."""


def check_config(box: Path, jail_args: list[str], kernel_prefix: list[str] | None = None) -> None:
    """Load the box's config as nbgrader will, and raise :class:`SandboxError` unless it runs the
    graded kernel in the jail: nbgrader runs *without* a config that fails to load, i.e. with no sandbox."""
    try:
        config = _load(box / "nbgrader_config.py")
    except Exception as err:  # any failure means the same: no sandbox
        raise SandboxError(f"{box / 'nbgrader_config.py'} does not load ({type(err).__name__}: {err})") from None
    steps = [s if isinstance(s, str) else f"{s.__module__}.{s.__qualname__}"
             for s in config.Autograde.get("autograde_preprocessors", [])]
    if EXECUTE not in steps or config.GpulabExecute.get("mode") != "graded" or \
            config.JailedKernelManager.get("jail_args") != jail_args or \
            config.JailedKernelManager.get("kernel_prefix", []) != (kernel_prefix or []):
        raise SandboxError(f"{box} does not switch on the sandboxed kernel; check the course's nbgrader_config.py")


def prepare(course: Path, template_db: Path, specs: dict[str, integrity.NotebookSpec], lab: str, student: str,
            box: Path, limits: Limits, sub: isolation.Submission | None = None,
            secrets: list[Path] | None = None, run: LabRun | None = None, real: str | None = None) -> list[str]:
    """Build the isolated course for one submission (``real``: its id when ``student`` is an alias);
    return the integrity notes. Raises UnreadableNotebook, or FileNotFoundError when none of the
    lab's notebooks was submitted (the message is the note)."""
    skipped = _copy_in(course, template_db, lab, student, box, limits, real)
    work = box / "autograded" / student / lab
    if run is not None:
        shutil.copyfile(run.expected, box / "expected.json")
        (box / "expected.json").chmod(0o600)
    if sub is not None:
        _mounts(box, student, limits, sub, run)
    jail_args = _jail_args(course, template_db, box, work, limits, sub, secrets)
    prefix = sub.kernel_prefix() if sub is not None else []
    write_box_config(box, box_settings(course, box, work, limits, jail_args, prefix, sub, run))
    check_config(box, jail_args, prefix)
    return _integrity_notes(box / "submitted" / student / lab, specs, lab, skipped)


def _integrity_notes(submitted: Path, specs: dict[str, integrity.NotebookSpec], lab: str, skipped: list[str]) -> list[str]:
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
        if path.exists():
            path.chmod(0o700 if path.is_dir() else 0o600)
    sub.give(box / "tmp")  # the kernel's own folder is handed over by nbgrader's side


def grading_root(private_tmp: bool) -> Path:
    """A new folder for the run's grading copies (``/var/tmp`` when each submission's private ``/tmp``
    would hide it)."""
    parent = Path(tempfile.gettempdir())
    if private_tmp and parent.resolve().is_relative_to("/tmp"):
        parent = Path("/var/tmp")
    root = Path(tempfile.mkdtemp(prefix="gpulab-grade-", dir=parent))
    root.chmod(0o711)  # a kernel under a uid of its own passes through to its own folder, lists nothing
    return root
