"""Which paths a student's kernel may read: everything except the instructor's files.

A kernel may read gpulab, torch, the system and its own folder, but not the hidden tests and
solutions (the course's ``source/``, every other student's ``submitted/`` work, the gradebook).
Landlock only *allows* (a rule grants a right on a folder and everything beneath it), so "all
but these folders" is built by walking down from ``/`` towards each denied path and granting
every sibling on the way::

    /            expanded (an ancestor of a denied path): each child gets its own rule
      usr/       granted, with everything beneath
      work/      expanded
        main/    expanded
          gpulab/     granted
          notebooks/  DENIED: no rule, so nothing beneath it can be read
          README.md   granted (a file rule)

Symbolic links are skipped: a link resolves to its target, which is readable only where the
target itself is. Entries created later directly in an expanded folder are not readable (a
granted folder's new entries are). The kernel writes only in its own folder and TMPDIR, both
granted, so this costs a lab nothing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Sequence

# include/uapi/linux/landlock.h: the one right this ruleset handles. Listing folders
# (READ_DIR) stays open: names are not the secret, contents are.
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
    """The folders and files to grant READ_FILE so that all but ``denied`` (resolved) is readable,
    except the ``allowed`` paths beneath a denied one (the kernel's own folders inside the grading
    folder, whose other entries, other students' grading copies included, stay unreadable).

    Raises:
        ValueError: when ``/`` itself is denied (nothing, Python included, would stay readable).
    """
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
    """What a student's kernel must not read in the course and the grading folder: the whole course
    folder (a kernel needs nothing in it), the run's gradebook snapshot, and the grading folder
    (every classmate's grading copy: their gradebooks, connection files, kernels' folders); the
    kernel's own folders beneath it are granted back (``--read``)."""
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
    """What else holds the solutions: for the git checkout that holds the course, and the one that
    holds the running gpulab (a course copied elsewhere still has its source there), the
    repository's git folders (``git show`` of any commit prints every source notebook) and, in
    every worktree of the repository, its ``.git`` and its course folder (``notebooks/``, with
    ``source/``). Empty outside git.

    A checkout that is not a worktree of these repositories (a second clone elsewhere) cannot be
    found from here: keep it out of the grading user's reach.
    """
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
