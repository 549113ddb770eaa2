"""Start a student's kernel inside limits: memory and file size (setrlimit), Landlock file rules
and signal scope, and a Python audit hook that names what was tried.

:class:`gpulab.autograde.execute.kernel.JailedKernelManager` puts ``python -m gpulab.confine.jail ... --`` in
front of the kernel command; the jail then *is* the kernel (same pid), so jupyter_client's
interrupts and kills reach it. Before any student code runs:

1. ``setrlimit``: ``RLIMIT_DATA`` (or ``RLIMIT_AS``) caps memory, so an allocation past the cap
   raises ``MemoryError`` in the cell instead of waking the OOM killer; ``RLIMIT_FSIZE`` caps a
   file; no core dumps.
2. Landlock (Linux 5.13+, ``Documentation/userspace-api/landlock.rst``), inherited by every child:
   no write outside the ``--write`` folders, no read of the ``--no-read`` paths (the course, the
   other grading copies, the repository), and from ABI 6 no signal to a process outside the jail.
3. ``sys.addaudithook``: Python's own file and signal events against the same rules are refused
   with a clear ``PermissionError`` and logged, so the grader can name the attempt even when the
   student catches the error. It is a witness, not a barrier: ctypes or a subprocess bypass it,
   and Landlock still holds.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from gpulab.confine import signal_targets

# include/uapi/linux/landlock.h; the syscall numbers are the same on every architecture.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_FS = {"write_file": 1 << 1, "remove_dir": 1 << 4, "remove_file": 1 << 5, "make_char": 1 << 6,
       "make_dir": 1 << 7, "make_reg": 1 << 8, "make_sock": 1 << 9, "make_fifo": 1 << 10,
       "make_block": 1 << 11, "make_sym": 1 << 12, "refer": 1 << 13, "truncate": 1 << 14}
# /dev/null, /dev/shm (DataLoader workers share tensors there) and /dev/nvidia* (opened read-write
# by CUDA), still guarded by their ordinary permissions.
SYSTEM_WRITABLE = ("/dev",)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return None
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none)."""
    libc = _libc()
    if libc is None:
        return 0
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


def _write_rights(abi: int) -> int:
    rights = 0
    for name, bit in _FS.items():
        if name == "refer" and abi < 2 or name == "truncate" and abi < 3:
            continue
        rights |= bit
    return rights


def _landlock(handled: int, rules: Sequence[tuple[str, int]], *, missing_ok: bool = False, scoped: int = 0) -> None:
    """Apply one Landlock layer: ``handled`` rights are refused except as ``rules`` grant them.
    ``missing_ok`` skips a rule whose path has gone (a temp file listed a moment ago)."""
    libc = _libc()
    attr = _RulesetAttr(handled_access_fs=handled, scoped=scoped)
    fd = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, rights in rules:
            try:
                path_fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
            except FileNotFoundError:
                if missing_ok:
                    continue
                raise
            try:
                rule = _PathBeneathAttr(allowed_access=rights, parent_fd=path_fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(path_fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)


def landlock_restrict_writes(writable: Sequence[str]) -> bool:
    """Forbid this process and its children to write anywhere but under ``writable``; False
    without Landlock (OSError when Landlock refuses the ruleset)."""
    abi = landlock_abi()
    if abi < 1:
        return False
    rights = _write_rights(abi)
    _landlock(rights, [(folder, rights) for folder in writable])
    return True


def landlock_deny_reads(denied: Sequence[str], allowed: Sequence[str] = ()) -> bool:
    """Forbid this process and its children to read files under ``denied`` (but ``allowed``
    beneath them); False without Landlock."""
    if landlock_abi() < 1:
        return False
    _landlock(READ_FILE, [(path, READ_FILE) for path in readable_paths(denied, allowed)], missing_ok=True)
    return True


# include/uapi/linux/landlock.h (ABI 6, Linux 6.12): a scoped process cannot signal, nor connect to
# an abstract unix socket of, a process outside its Landlock domain: the grader, nbgrader, and the
# kernels of classmates graded at the same time.
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


def landlock_scope() -> bool:
    """Keep this process and its children from signalling (or connecting to an abstract unix socket
    of) any process outside them; False before Landlock ABI 6."""
    if landlock_abi() < 6:
        return False
    _landlock(0, [], scoped=_SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET)
    return True


# ---- reads: Landlock only grants, so "all but these paths" is built by walking down from / towards
# each denied path and granting every sibling on the way. Symbolic links are not granted (a link
# reads as its target). READ_FILE is the one right handled: names are not the secret, contents are.
READ_FILE = 1 << 2


def _ancestors(path: str) -> set[str]:
    out, cur = set(), path
    while True:
        parent = os.path.dirname(cur)
        if parent == cur:
            return out
        out.add(parent)
        cur = parent


def readable_paths(denied: Sequence[str], allowed: Sequence[str] = ()) -> list[str]:
    """The paths to grant READ_FILE so that all but ``denied`` is readable, and the ``allowed``
    paths beneath a denied one (the kernel's own folders in the grading folder). ValueError for ``/``."""
    deny = {os.path.realpath(d) for d in denied}
    allow = {os.path.realpath(a) for a in allowed}
    if "/" in deny:
        raise ValueError("cannot deny reading /: the kernel could not load Python")
    expand = set().union(*(_ancestors(d) for d in deny)) - deny
    towards_allowed = set().union(*(_ancestors(a) for a in allow))
    grant: list[str] = []
    stack = ["/"]
    while stack:
        folder = stack.pop()
        if folder in deny or is_beneath(folder, tuple(deny)):
            # inside a denied folder, only the way to an allowed path is walked, by name: a kernel
            # under a uid of its own may pass through the grading folder (0711) but not list it
            for a in allow:
                if a != folder and is_beneath(a, (folder,)):
                    step = os.path.join(folder, os.path.relpath(a, folder).split(os.sep)[0])
                    if step == a:
                        grant.append(a)
                    elif step not in stack:
                        stack.append(step)
            continue
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # an unreadable folder: nothing beneath it can be granted anyway
        for entry in entries:
            path = entry.path
            if entry.is_symlink():
                continue
            if path in allow:
                grant.append(path)
            elif path in deny or is_beneath(path, tuple(deny)):
                if path in towards_allowed:
                    stack.append(path)  # denied, but an allowed path lies beneath: walk down to it only
            elif path in expand:
                stack.append(path)
            else:
                grant.append(path)
    return sorted(grant)


def is_beneath(path: str, folders: Sequence[str]) -> bool:
    """``path`` (already resolved) is one of ``folders`` or beneath one."""
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def instructor_files(course: Path, box: Path, template_db: Path) -> list[Path]:
    """What a kernel must not read: the course folder, the run's gradebook snapshot and the grading
    folder (every classmate's grading copy); its own folders there are granted back (``--read``)."""
    course, box = course.resolve(), box.resolve()
    if box.is_relative_to(course):  # a sandbox inside the course: keep the kernel's own folder readable
        inside = [course / n for n in ("source", "submitted", "autograded", "feedback", "grading_logs")]
        inside += list(course.glob("gradebook.db*"))
    else:
        inside = [course]
    return inside + [template_db.resolve(), box.parent.parent]


def _git(cwd: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def repository_secrets(course: Path) -> list[Path]:
    """What else holds the solutions, for the checkouts of the course and of the running gpulab: the
    git folders (``git show`` prints every source notebook) and each worktree's ``.git`` and course
    folder. A second clone elsewhere cannot be found from here (the namespace hides it)."""
    course = Path(course).resolve()
    found: list[Path] = []
    for start in (course, Path(__file__).resolve().parents[2]):
        top = _git(start, "rev-parse", "--show-toplevel")
        if not top:
            continue
        top_path = Path(top).resolve()
        for spec in ("--git-common-dir", "--git-dir"):
            out = _git(start, "rev-parse", "--path-format=absolute", spec)
            if out:
                found.append(Path(out).resolve())
        rels = {Path("notebooks")}
        if course.is_relative_to(top_path) and course != top_path:
            rels.add(course.relative_to(top_path))
        listing = _git(start, "worktree", "list", "--porcelain") or ""
        trees = {top_path} | {Path(line[len("worktree "):]).resolve() for line in listing.splitlines()
                               if line.startswith("worktree ")}
        for tree in sorted(trees):
            found += [tree / ".git"] + [tree / rel for rel in sorted(rels)]
    return [p for p in dict.fromkeys(found) if os.path.lexists(p)]


def set_limits(memory_mb: int, memory_rlimit: str = "data", fsize_mb: int = 0) -> None:
    """Cap memory (MiB, 0: none) and file size (MiB, 0: none); no core dumps. ``RLIMIT_DATA``, the
    default, counts what code allocates; ``RLIMIT_AS`` counts reserved address space, which CUDA
    and every thread's malloc arena inflate."""
    kinds = {"data": resource.RLIMIT_DATA, "as": resource.RLIMIT_AS}
    if memory_rlimit not in kinds:
        raise ValueError(f"memory_rlimit={memory_rlimit!r}; use 'data' or 'as'")
    if memory_mb > 0:
        resource.setrlimit(kinds[memory_rlimit], (memory_mb * 2**20, memory_mb * 2**20))
    if fsize_mb > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_mb * 2**20, fsize_mb * 2**20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# Audit events that change the file system, and which of their arguments are paths.
_PATH_EVENTS: dict[str, tuple[int, ...]] = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.symlink": (1,),
    "os.link": (1,), "os.truncate": (0,), "shutil.rmtree": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _closest(path: str, folders: Sequence[str]) -> int:
    """The length of the longest of ``folders`` that ``path`` is (beneath); -1 for none."""
    return max((len(f) for f in folders if is_beneath(path, (f,))), default=-1)


def file_guard(writable: Sequence[str] | None, log: Callable[[dict], None],
               unreadable: Sequence[str] = (), readable: Sequence[str] = (),
               unwritable: Sequence[str] = ()) -> Callable[[str, tuple], None]:
    """An audit hook that refuses and logs Python-level writes outside ``writable`` (None: not
    guarded) or under ``unwritable``, reads under ``unreadable`` (but ``readable``), and logs signals
    to processes outside the kernel's tree. Paths are resolved; the most specific rule wins."""
    folders = None if writable is None else tuple(os.path.realpath(f) for f in writable)
    frozen = tuple(os.path.realpath(f) for f in unwritable)
    hidden = tuple(os.path.realpath(f) for f in unreadable)
    allowed = tuple(os.path.realpath(f) for f in readable)

    me = os.getpid()

    def hook(event: str, args: tuple) -> None:
        if event in ("os.kill", "os.killpg") and args and isinstance(args[0], int) and args[0] != me:
            target = signal_targets.outside(args[0], event == "os.killpg", me)
            if target:
                log({"event": "signal", "path": target})
            return
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if not writing:
                if hidden and path is not None and not isinstance(path, int):
                    real = os.path.realpath(os.fsdecode(path))
                    if _closest(real, hidden) > _closest(real, allowed):  # the most specific rule wins
                        log({"event": "read", "path": real})
                        raise PermissionError(f"gpulab grading sandbox: reading {real} is not allowed; a lab "
                                              f"reads its own folder, gpulab and the libraries, not the course")
                return
            targets = [path]
        elif event in _PATH_EVENTS:
            targets = [args[i] for i in _PATH_EVENTS[event] if i < len(args)]
        else:
            return
        if folders is None:
            return
        for target in targets:
            if target is None or isinstance(target, int):
                continue  # an already-open file descriptor
            real = os.path.realpath(os.fsdecode(target))
            if not is_beneath(real, folders) or _closest(real, frozen) > _closest(real, folders):
                if "__pycache__" not in real:  # importlib's bytecode cache: refused quietly, imports still work
                    log({"event": event, "path": real})
                raise PermissionError(f"gpulab grading sandbox: writing to {real} is not allowed; a lab may only "
                                      f"write in its own folder or in tempfile.gettempdir()")

    return hook


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpulab.confine.jail", description=__doc__.splitlines()[0])
    p.add_argument("--memory-mb", type=int, default=0)
    p.add_argument("--memory-rlimit", choices=("data", "as"), default="data")
    p.add_argument("--fsize-mb", type=int, default=0)
    p.add_argument("--write", action="append", default=[], help="a folder the kernel may write in (repeat)")
    p.add_argument("--no-write", action="append", default=[],
                   help="a folder beneath a --write one that stays read-only (repeat)")
    p.add_argument("--no-read", action="append", default=[], help="a folder or file the kernel may not read (repeat)")
    p.add_argument("--read", action="append", default=[], help="a folder beneath a --no-read one that stays readable")
    p.add_argument("--audit-log", default=None, help="JSON lines of refused writes")
    p.add_argument("--audit-fd", type=int, default=None, help="an inherited descriptor to write the JSON lines to")
    p.add_argument("--home", default=None, help="the kernel's HOME (a folder it may write in)")
    p.add_argument("--oom-first", action="store_true", help="be the first process the OOM killer takes")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- -m module args... | -- program args...")
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("nothing to run: give the command after --")
    writable = [os.path.realpath(w) for w in args.write] + [d for d in SYSTEM_WRITABLE if os.path.isdir(d)]
    # Opened before the ruleset, so the log stays writable wherever it lives.
    log_fd = os.open(args.audit_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if args.audit_log else args.audit_fd

    def log(entry: dict) -> None:
        if log_fd is not None:
            try:
                os.write(log_fd, (json.dumps(entry) + "\n").encode())
            except OSError:  # the kernel closed its end: the grader has noted that
                pass

    set_limits(args.memory_mb, args.memory_rlimit, args.fsize_mb)
    if args.home:
        os.environ["HOME"] = args.home
    if args.oom_first:  # the kernel, not nbgrader, goes first when the cgroup runs out (raising needs no right)
        try:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass
    landlock = landlock_restrict_writes(writable) if args.write else False
    unreadable = [os.path.realpath(p) for p in args.no_read]
    readable = [os.path.realpath(p) for p in args.read]
    if unreadable:
        landlock = landlock_deny_reads(unreadable, readable) or landlock
    scoped = landlock_scope()
    # The first line of the log: the grader refuses a run whose kernel never got here.
    log({"event": "jail", "landlock": landlock, "writable": writable if args.write else None,
         "unreadable": unreadable or None, "memory_mb": args.memory_mb, "scoped": scoped})
    if command[0] != "-m":
        os.execvp(command[0], command)  # not Python: limits and Landlock are inherited by exec
    if args.write or unreadable:
        sys.addaudithook(file_guard(writable if args.write else None, log, unreadable, readable,
                                   [os.path.realpath(p) for p in args.no_write]))
    sys.argv = [command[1], *command[2:]]
    runpy.run_module(command[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
