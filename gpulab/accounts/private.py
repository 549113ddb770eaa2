"""The course's private part, closed to every student account by its modes, not by convention.

On a hub every student has a terminal, so what protects the solutions is the file system:

    <course>/            the instructor's (the roster's first instructor), group gpulab-instructors
                         (every instructor of the roster), mode 2770: others may not even enter;
                         source/, submitted/, autograded/, feedback/, gradebook.db and its backups,
                         grades.csv, grading_logs/, the reference runs: all under it, no bit for others
    <kit>/notebooks, tests, .git, build, work, test-artifacts
                         the kit's own copies of the solutions and hidden tests: no bit for others
    <kit>/.venv, <kit>/gpulab
                         the kit's code and environment: readable by all (every server runs them)
    <state>/jupyterhub.sqlite, cookie secret            root's only (0600)

:func:`close` sets this up (as root, in ``make hub`` before the hub starts, and after every step
of the term's loop that writes into the course: release, collect, grade, feedback); new files keep
the group (setgid folders) and lose the others' bits. :func:`exposed` says, for each private path,
why a student could read or write it; ``make hub`` refuses to start while any is.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
from pathlib import Path

from gpulab.accounts import users

GROUP = "gpulab-instructors"
KIT_PRIVATE = ("notebooks", "tests", ".git", "build", "work", "test-artifacts")
STATE_PRIVATE = ("jupyterhub.sqlite", "jupyterhub_cookie_secret", "plan.json", "new-passwords.csv")


def kit_root() -> Path:
    return Path(__file__).resolve().parents[2]


def private_paths(course: str | Path, state: str | Path | None = None, kit: str | Path | None = None) -> list[Path]:
    """Every private path that exists: the course, the kit's private folders, the hub's database."""
    kit = Path(kit) if kit else kit_root()
    paths = [Path(course).resolve(), *(kit / p for p in KIT_PRIVATE)]
    if state is not None:
        paths += [Path(state) / p for p in STATE_PRIVATE]
    out: list[Path] = []
    for p in paths:
        if p.exists() and not any(p == q or q in p.parents for q in out):
            out.append(p)
    return out


def ensure_group(instructors: list[str]) -> int:
    """The instructors' group (created if missing), with every instructor of the roster in it; its gid."""
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True, capture_output=True)
        gid = grp.getgrnam(GROUP).gr_gid
    members = set(grp.getgrnam(GROUP).gr_mem)
    for user in instructors:
        if user not in members:
            subprocess.run(["usermod", "-a", "-G", GROUP, user], check=True, capture_output=True)
    return gid


def _walk(top: Path):
    yield top
    if top.is_dir() and not top.is_symlink():
        for dirpath, dirnames, filenames in os.walk(top):
            for name in (*dirnames, *filenames):
                yield Path(dirpath) / name


def close_course(course: str | Path, owner: str | None = None, gid: int | None = None) -> int:
    """Give the course to ``owner`` and the instructors' group (as root), folders 2770 and files
    without the others' bits; links are changed, never followed. Returns how many entries changed."""
    course = Path(course).resolve()
    uid = pwd.getpwnam(owner).pw_uid if owner else course.stat().st_uid
    if gid is None:
        try:
            gid = grp.getgrnam(GROUP).gr_gid
        except KeyError:
            gid = course.stat().st_gid
    changed = 0
    for p in _walk(course):
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (uid, gid):
                os.chown(p, uid, gid, follow_symlinks=False)
            continue
        mode = stat.S_IMODE(st.st_mode)
        want = (mode & 0o770) | 0o2770 if stat.S_ISDIR(st.st_mode) else (mode & 0o770) | 0o660
        if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(p, uid, gid, follow_symlinks=False)
            changed += 1
        if mode != want:
            os.chmod(p, want)
            changed += 1
    return changed


def settle(course: str | Path) -> int:
    """After a step that wrote into a closed course (``make grade``, collect, release, feedback):
    what it wrote goes to the course's owner and group, without the others' bits. A course that is
    not closed (a laptop's ``notebooks/``) is left as it is. Returns how many entries changed."""
    course = Path(course).resolve()
    if not course.is_dir() or course.stat().st_mode & 0o007:
        return 0
    try:
        return close_course(course, gid=course.stat().st_gid)
    except PermissionError as err:  # not root, and a file of someone else's: say so, change nothing more
        print(f"warning: {err.filename}: {err.strerror}; run this step as the course's owner or with sudo")
        return 0


def close_others(paths: list[Path]) -> int:
    """Take every bit for others off ``paths`` and all under them (the kit's private folders, the
    hub's database); owners stay. Returns how many entries changed."""
    changed = 0
    for top in paths:
        for p in _walk(top):
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o007:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o007)
                changed += 1
    return changed


def close(course: str | Path, state: str | Path | None, instructors: list[str] | None = None) -> int:
    """The whole private part closed (see the module doc); as root. Returns how many entries changed."""
    course = Path(course).resolve()
    gid = ensure_group(instructors) if instructors else None
    owner = pwd.getpwuid(course.stat().st_uid).pw_name if course.exists() else None
    if instructors and owner not in instructors:
        owner = instructors[0]
    changed = close_course(course, owner, gid)
    others = [p for p in private_paths(course, state) if p != course and course not in p.parents]
    return changed + close_others(others)


def exposed(paths: list[Path], students: list[str]) -> list[str]:
    """Why a student account could read or write each private path (empty: none can).

    A private path is closed when others have no bit on it and neither its owner nor its group
    is a student's: nothing under it can then be reached by a student, whatever its own modes."""
    uids = {pwd.getpwnam(s).pw_uid: s for s in students if users.exists(s)}
    out = []
    for p in paths:
        st = os.lstat(p)
        what = "folder" if stat.S_ISDIR(st.st_mode) else "file"
        if st.st_mode & 0o007:
            out.append(f"{p}: the {what} is open to every account (mode {oct(stat.S_IMODE(st.st_mode))}); "
                       f"fix: chmod -R o-rwx {p}")
        if st.st_uid in uids:
            out.append(f"{p}: belongs to the student {uids[st.st_uid]}; fix: chown -R <instructor> {p}")
        try:
            members = set(grp.getgrgid(st.st_gid).gr_mem)
            name = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            continue
        in_group = sorted(s for s in students if s in members or (users.exists(s) and pwd.getpwnam(s).pw_gid == st.st_gid))
        if in_group and st.st_mode & 0o070:
            out.append(f"{p}: its group {name} holds the student(s) {', '.join(in_group)}; "
                       f"fix: chgrp -R {GROUP} {p} (make hub does this)")
    return out


def owner_name(path: str | Path) -> str:
    return pwd.getpwuid(Path(path).stat().st_uid).pw_name
