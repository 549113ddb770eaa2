"""Never follow what a submission planted: links, FIFOs, device nodes and hard links.

The grader reads or writes with the instructor's rights two folders a student controls: the
submission and the folder its kernel ran in. A symlink there would redirect nbgrader's writes
(onto a classmate's submission, the gradebook) or a copy (of ``source/``, of ``/dev/zero``); a
hard link or a FIFO does the same with less to see. So a submission is copied file by file
(:func:`copy_regular`: ``O_NOFOLLOW``, then ``fstat``: regular, one link, under the cap), every
special file is deleted from the kernel's folder before nbgrader writes there again
(:func:`remove_unsafe`), and only regular notebooks come back (:func:`copy_notebooks`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device")):
        if test(mode):
            return name
    return "special file"


def _unsafe(st: os.stat_result) -> str | None:
    """Why a file must not be touched (None: a plain, singly-linked file or a real folder)."""
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        return _kind(st.st_mode)
    if st.st_nlink > 1:
        return "hard link"
    return None


def remove_unsafe(folder: str | Path) -> list[str]:
    """Delete every symlink, FIFO, socket, device node and multiply-linked file under ``folder``
    (never following a link); return what was removed, relative to ``folder``."""
    folder = Path(folder)
    removed: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        d = Path(dirpath)
        for name in list(dirnames) + filenames:
            path = d / name
            try:
                why = _unsafe(path.lstat())
                if why is not None:
                    path.unlink()
                    removed.append(f"{path.relative_to(folder)} ({why})")
            except FileNotFoundError:
                continue
        dirnames[:] = [n for n in dirnames if (d / n).is_dir() and not (d / n).is_symlink()]
    return removed


def _open_regular(src: Path, max_bytes: int) -> tuple[int | None, str | None]:
    """(fd, None) for a regular, singly-linked file of at most ``max_bytes`` (never a link, never a
    FIFO's blocking open); (None, why not) otherwise."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:  # ELOOP: a symlink; ENXIO: a FIFO without a writer
        try:
            return None, _unsafe(src.lstat()) or err.strerror
        except OSError:
            return None, err.strerror
    st = os.fstat(fd)
    why = _unsafe(st) or (f"larger than {max_bytes // 2**20} MiB" if st.st_size > max_bytes else None)
    if why:
        os.close(fd)
        return None, why
    return fd, None


def read_regular(src: str | Path, max_bytes: int) -> bytes | None:
    """The bytes of ``src`` if it is a regular, singly-linked file of at most ``max_bytes``, else None."""
    fd, _ = _open_regular(Path(src), max_bytes)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
        return None if len(data) > max_bytes else data  # it grew while being read
    finally:
        os.close(fd)


def _copy_fd(src: Path, dst: Path, max_bytes: int) -> str | None:
    """Copy one file if it is a regular, singly-linked file of at most ``max_bytes``; else why not."""
    fd, why = _open_regular(src, max_bytes)
    if fd is None:
        return why
    try:
        copied = 0
        with open(dst, "wb") as out:
            while chunk := os.read(fd, _CHUNK):
                copied += len(chunk)
                if copied > max_bytes:  # it grew while being read
                    break
                out.write(chunk)
        if copied > max_bytes:
            dst.unlink()
            return f"larger than {max_bytes // 2**20} MiB"
        return None
    finally:
        os.close(fd)


def copy_regular(src: str | Path, dst: str | Path, max_bytes: int, skip: tuple[str, ...] = (".ipynb_checkpoints",),
                 max_total: int | None = None) -> list[str]:
    """Copy the regular files under ``src`` into ``dst``, never following a link, up to ``max_total``
    bytes (sparse files count in full); returns what was skipped and why (``"a.ipynb (symlink)"``)."""
    total = max_total if max_total is not None else float("inf")
    budget = [total, total]  # bytes left, bytes allowed
    return _copy_tree(Path(src), Path(dst), max_bytes, skip, budget)


def _copy_tree(src: Path, dst: Path, max_bytes: int, skip: tuple[str, ...], budget: list[float]) -> list[str]:
    dst.mkdir(parents=True, exist_ok=True)
    skipped: list[str] = []
    # notebooks first, so that data files cannot crowd the lab's notebook out of the budget
    for entry in sorted(os.scandir(src), key=lambda e: (not e.name.endswith(".ipynb"), e.name)):
        if entry.name in skip:
            continue
        path = Path(entry.path)
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            skipped += [f"{entry.name}/{s}" for s in _copy_tree(path, dst / entry.name, max_bytes, skip, budget)]
            continue
        why = _copy_fd(path, dst / entry.name, int(min(max_bytes, budget[0])))
        if why and why.startswith("larger than") and budget[0] < max_bytes:
            why = f"past the {int(budget[1]) // 2**20} MiB a submission may hold in all"
        elif why is None:
            budget[0] -= (dst / entry.name).stat().st_size
        if why:
            skipped.append(f"{entry.name} ({why})")
    return skipped


def copy_notebooks(src: str | Path, dst: str | Path, max_bytes: int) -> list[str]:
    """Copy the regular ``*.ipynb`` files directly in ``src`` to ``dst`` (created); return what
    was skipped and why."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    skipped = []
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if entry.name.endswith(".ipynb"):
            why = _copy_fd(Path(entry.path), dst / entry.name, max_bytes)
            if why:
                skipped.append(f"{entry.name} ({why})")
    return skipped
