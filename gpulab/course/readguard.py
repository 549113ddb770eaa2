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
