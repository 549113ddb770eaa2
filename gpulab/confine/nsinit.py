"""PID 1 of a submission's namespaces: join its cgroup, mount its private ``/tmp``, ``/dev/shm`` and
``/dev/pts``, hide the rest of the machine, bring up loopback, then run nbgrader and reap the rest.

:mod:`gpulab.confine.isolation` starts it through util-linux ``unshare`` (PID, mount, IPC, network
and UTS namespaces; a user namespace too where the grader is not root)::

    unshare --pid --fork --kill-child --mount-proc --mount ... -- python -m gpulab.confine.nsinit \
        --cgroup-procs .../grader/cgroup.procs --tmp-mb 1024 ... -- python -m gpulab.confine.jail ... -- nbgrader ...

Being PID 1 is why it exists: when it exits, Linux kills every other process of the namespace,
whatever session or environment it gave itself. It also inherits and reaps every orphan, and
passes the grader's signals on to nbgrader. The mounts are plain ``mount(2)`` calls (it holds
``CAP_SYS_ADMIN`` over the new mount namespace) and last as long as the namespace; their tmpfs
pages count in the submission's memory cgroup.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys
from typing import Any, TextIO

# include/uapi/linux/mount.h
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
# include/uapi/linux/sockios.h and if.h
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str = "") -> None:
    """``mount(2)``; raises OSError naming the target."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                  data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} on {target} failed: {os.strerror(err)}")


def loopback_up() -> None:
    """Bring ``lo`` up (a new network namespace starts with it down; ZMQ and gloo need it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def private_mounts(tmp_mb: int, shm_mb: int, keep: list[str] | None = None,
                   mask: list[str] | None = None) -> list[str]:
    """Fresh size-capped tmpfs on ``/tmp`` and ``/dev/shm``, and a devpts instance of its own (none of
    the machine's terminals). Of ``keep`` (this Python, gpulab), what lies under ``/tmp`` is bound back
    read-only, and each of ``mask`` inside it is covered by an empty mount: a Landlock rule on the
    kernel's writable ``/tmp`` also covers what is mounted beneath it. Returns the folders kept."""
    kept = under_tmp(keep or [])
    _cover("/tmp", f"size={tmp_mb}m,mode=1777", kept, read_only=True)
    for path in _masked(mask or [], kept):
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0555")
        else:
            mount("/dev/null", path, None, MS_BIND)
    if os.path.isdir("/dev/shm"):
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_mb}m,mode=1777")
    if os.path.isdir("/dev/pts"):
        mount("devpts", "/dev/pts", "devpts", MS_NOSUID, "newinstance,ptmxmode=0666,mode=0620")
        if os.path.exists("/dev/ptmx"):
            mount("/dev/pts/ptmx", "/dev/ptmx", None, MS_BIND)  # openpty() allocates in the new instance
    return kept


# Top-level folders every process needs, left as they are; every other one is replaced by an empty
# folder in the submission's namespace, with only the paths it must reach bound back (hide_machine).
SYSTEM_TOP = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "sys", "dev", "tmp"})


def hide_machine(read_only: list[str], writable: list[str]) -> list[str]:
    """Cover every top-level folder but :data:`SYSTEM_TOP` (homes, ``/opt``, ``/var``: wherever another
    clone of the course might be) with an empty tmpfs, binding back ``read_only`` (this Python,
    gpulab) and ``writable`` (the grading folder). Returns the folders covered."""
    keep = sorted({os.path.realpath(p) for p in read_only + writable if os.path.exists(p)})
    ro = {os.path.realpath(p) for p in read_only}
    hidden = []
    for name in sorted(os.listdir("/")):
        top = "/" + name
        if name in SYSTEM_TOP or os.path.islink(top) or not os.path.isdir(top) or top in keep:
            continue
        inside = [p for p in keep if _beneath(p, [top])]
        inside = [p for p in inside if not _beneath(p, [q for q in inside if q != p])]  # outermost only
        _cover(top, "size=1m,mode=0755", inside)
        for path in inside:
            if path in ro:
                mount("none", path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _locked_flags(path))
        hidden.append(top)
    return hidden


def quota_mounts(specs: list[str]) -> list[tuple[str, int, dict[str, int]]]:
    """A size- and file-capped tmpfs over each ``FOLDER:MIB:FILES``, its contents copied in: what a
    submission writes counts against its own cap, not the grading disk. Returns, for :func:`copy_out`,
    each folder, an ``O_PATH`` descriptor of what lies beneath the mount, and the caps."""
    out = []
    for spec in specs:
        folder, mib, files = spec.rsplit(":", 2)
        st = os.stat(folder)
        under = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(mib)}m,nr_inodes={int(files)},mode=0711")
        os.chmod(folder, st.st_mode & 0o7777)
        _chown(folder, st)
        _copy_tree(f"/proc/self/fd/{under}", folder)
        out.append((folder, under, {"mib": int(mib), "files": int(files)}))
    return out


def _chown(path: str, st: os.stat_result) -> None:
    try:
        os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)
    except OSError:  # an owner the user namespace does not map
        pass


def _copy_tree(src: str, dst: str, max_bytes: int | None = None, left: list[int] | None = None) -> int:
    """Copy the folders and regular, singly-linked files beneath ``src`` into ``dst`` with their modes
    and owners (the size of each file over ``max_bytes`` goes to ``left``); returns the files copied."""
    import shutil
    import stat

    copied = 0
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        st = os.lstat(s)
        if stat.S_ISDIR(st.st_mode):
            os.makedirs(d, exist_ok=True)
            os.chmod(d, st.st_mode & 0o7777)
            _chown(d, st)
            copied += _copy_tree(s, d, max_bytes, left)
        elif stat.S_ISREG(st.st_mode) and max_bytes is not None and st.st_size > max_bytes:
            if left is not None:
                left.append(st.st_size)
        elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            with open(s, "rb") as fin, open(d, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            os.chmod(d, st.st_mode & 0o7777)
            _chown(d, st)
            copied += 1
    return copied


def fs_usage(folder: str) -> dict[str, float]:
    """MiB and files used on the filesystem of ``folder``."""
    st = os.statvfs(folder)
    return {"used_mb": round((st.f_blocks - st.f_bfree) * st.f_frsize / 2**20, 1), "files": st.f_files - st.f_ffree}


def copy_out(quotas: list[tuple[str, int, dict[str, int]]], back: list[str], max_bytes: int) -> dict[str, dict]:
    """Once nbgrader is done: each quota folder's use, and the ``back`` folders (the autograded
    notebooks) copied beneath their mount, where the grader finds them once the namespace is gone."""
    report = {}
    for folder, under, caps in quotas:
        report[folder] = {**fs_usage(folder), "cap_mb": caps["mib"], "cap_files": caps["files"]}
        if folder in back:
            left: list[int] = []
            try:
                _copy_tree(folder, f"/proc/self/fd/{under}", max_bytes, left)
            except OSError as err:
                report[folder]["copy_error"] = str(err)
            if left:  # too big to copy (sparse files count at their apparent size): dropped, and said
                report[folder]["not_copied"] = {"files": len(left), "apparent_mb": round(sum(left) / 2**20)}
    return report


def bind_over(pairs: list[tuple[str, str]]) -> None:
    """Bind each ``source`` read-only over an existing ``target`` (:mod:`gpulab.autograde.box.mask`)."""
    for source, target in pairs:
        if not os.path.lexists(target):
            continue
        mount(source, target, None, MS_BIND)
        mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _locked_flags(target))


def _cover(folder: str, tmpfs_options: str, keep: list[str], read_only: bool = False) -> None:
    """An empty tmpfs over ``folder``, with each of ``keep`` bound back (opened first: once covered,
    they cannot be named)."""
    fds = [os.open(p, os.O_PATH | os.O_CLOEXEC) for p in keep]
    try:
        mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_options)
        for path, fd in zip(keep, fds):
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            if read_only:
                mount("none", path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _locked_flags(path))
    finally:
        for fd in fds:
            os.close(fd)


def _locked_flags(path: str) -> int:
    """The flags a remount of ``path`` must keep (in a user namespace, dropping nosuid, nodev,
    noexec or an atime flag that the machine's mount has is refused with EPERM)."""
    f = os.statvfs(path).f_flag
    flags = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)  # ST_* = MS_* for these
    return flags | (MS_RELATIME if f & 4096 else 0)  # ST_RELATIME


def _masked(paths: list[str], kept: list[str]) -> list[str]:
    """The existing ones of ``paths`` (resolved) that lie beneath one of ``kept``."""
    real = {os.path.realpath(p) for p in paths}
    return sorted(p for p in real if os.path.lexists(p) and _beneath(p, kept))


def under_tmp(paths: list[str]) -> list[str]:
    """The existing folders among ``paths`` that lie under ``/tmp`` (resolved), outermost only."""
    inside = sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})
    inside = [p for p in inside if p.startswith("/tmp/")]
    return [p for p in inside if not _beneath(p, [q for q in inside if q != p])]


def _beneath(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f + "/") for f in folders)


def _closed_ancestor(path: str) -> str | None:
    """The topmost folder above ``path`` that other users cannot pass through (no ``o+x``)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        folder = "/" + "/".join(parts[:i])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def expose(paths: list[str]) -> list[str]:
    """Let a kernel under a uid of its own reach ``paths`` through a folder closed to others (pyenv
    under ``/root``, 0700): cover that folder with an empty tmpfs and bind the paths back. Returns
    the folders covered."""
    closed: dict[str, list[str]] = {}
    for path in paths:
        top = _closed_ancestor(path)
        if top is not None:
            closed.setdefault(top, []).append(path)
    for top, inside in closed.items():
        _cover(top, "size=1m,mode=0755", inside)
    return sorted(closed)


def run(command: list[str], report_to: TextIO | None, finish: Any = None) -> int:
    """Start ``command``, pass on the grader's signals, reap every orphan; return its exit status
    (``finish()``, once the command is done, adds to the report)."""
    child = os.fork()
    if child == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as err:
            print(f"gpulab.confine.nsinit: cannot start {command[0]}: {err}", file=sys.stderr, flush=True)
        finally:
            os._exit(127)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child:
            if report_to is not None:
                extra = finish() if finish is not None else {}
                json.dump({**report(usage.ru_maxrss), **extra}, report_to)
                report_to.close()
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _used_mb(path: str) -> float | None:
    try:
        return fs_usage(path)["used_mb"]
    except OSError:
        return None


def report(maxrss_kib: int) -> dict[str, object]:
    """What the submission leaves when nbgrader is done: nbgrader's peak memory (its kernel's
    included), the use of ``/tmp`` and ``/dev/shm``, and every process still running."""
    left = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    head, _, tail = fh.read().rpartition(")")
            except OSError:
                continue
            if tail.split()[:1] != ["Z"]:  # a zombie is already dead, waiting to be reaped
                left.append(head.partition("(")[2])
    return {"maxrss_kib": maxrss_kib, "tmp_used_mb": _used_mb("/tmp"), "shm_used_mb": _used_mb("/dev/shm"),
            "left_running": sorted(left)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m gpulab.confine.nsinit", description=__doc__.splitlines()[0])
    p.add_argument("--cgroup-procs", action="append", default=[], help="a cgroup.procs file to join (repeat)")
    p.add_argument("--tmp-mb", type=int, default=1024)
    p.add_argument("--shm-mb", type=int, default=1024)
    p.add_argument("--no-mounts", action="store_true", help="keep the machine's /tmp and /dev/shm")
    p.add_argument("--keep", action="append", default=[],
                   help="a path under /tmp to keep reachable in the private /tmp (repeat)")
    p.add_argument("--mask", action="append", default=[],
                   help="a path no kernel may read: shown empty where it lies in a kept folder (repeat)")
    p.add_argument("--expose", action="append", default=[],
                   help="a path the kernel's uid must reach through a closed folder (repeat)")
    p.add_argument("--hide", action="store_true",
                   help="hide every top-level folder but the system's, binding back --see and --see-rw paths")
    p.add_argument("--see", action="append", default=[], help="a path to keep, read-only, under --hide (repeat)")
    p.add_argument("--see-rw", action="append", default=[], help="a path to keep, writable, under --hide (repeat)")
    p.add_argument("--quota", action="append", default=[], metavar="FOLDER:MIB:FILES",
                   help="a size- and file-capped tmpfs over FOLDER, its contents copied in (repeat)")
    p.add_argument("--copy-back", action="append", default=[],
                   help="a --quota folder whose contents are copied back beneath it at the end (repeat)")
    p.add_argument("--max-file-mb", type=int, default=100, help="the largest file --copy-back copies")
    p.add_argument("--bind", action="append", default=[], metavar="SOURCE:TARGET",
                   help="bind SOURCE read-only over TARGET (a masked reference; repeat)")
    p.add_argument("--report", default=None, help="write what the submission left here (JSON, nsinit.report)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("nothing to run: give the command after --")
    # opened before the mounts: a path under /tmp would be hidden by the private /tmp
    report_to = open(args.report, "w") if args.report else None  # closed once written
    quotas: list = []
    try:
        for procs in args.cgroup_procs:  # first: every process from here on is in the group
            with open(procs, "w") as fh:
                fh.write("0")
        if not args.no_mounts:
            private_mounts(args.tmp_mb, args.shm_mb, args.keep, args.mask)
            if args.hide:
                hide_machine(args.see, args.see_rw)
            expose(args.expose)
            bind_over([tuple(b.split(":", 1)) for b in args.bind])
            quotas = quota_mounts(args.quota)
        loopback_up()
    except OSError as err:
        print(f"gpulab.confine.nsinit: the submission's namespaces could not be set up: {err}", file=sys.stderr)
        sys.exit(125)
    back = [os.path.realpath(b) for b in args.copy_back]
    sys.exit(run(command, report_to, lambda: {"quota": copy_out(quotas, back, args.max_file_mb * 2**20)}))


if __name__ == "__main__":
    main()
