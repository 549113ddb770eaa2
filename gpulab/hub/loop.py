"""The term's loop through the exchange, one command per step (run in the repository, by the
instructor or by root; each nbgrader step runs as the **course folder's owner**, so the files it
writes stay the instructor's and the formgrader can still write them):

    make hub-release  LAB=00_setup [DUE="2026-10-01 17:00:00 UTC"]   # generate, then release to the exchange
                                         # (a due date already past: asks, or FORCE=1)
    make hub-extend   LAB=00_setup STUDENT=alice UNTIL="2026-10-03 17:00:00 UTC"   # one student's extension
    make hub-collect  LAB=00_setup       # the exchange's latest submission of each student -> notebooks/submitted/
    make grade        LAB=00_setup       # as for any class (sandboxed, in parallel)
    make hub-feedback LAB=00_setup       # the kit's clean feedback (hidden tests removed), released to the exchange

Each nbgrader command runs with the instructor's settings of the running hub
(``<state>/jupyter/instructor``: the exchange and the course id), in the course root.
Every step that writes into the course closes what it wrote (:func:`gpulab.accounts.private.settle`):
the course owner's and the instructors' group, nothing for others, nothing left root's.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from gpulab.accounts.private import settle
from gpulab.hub import extensions


def owner(course: str | Path) -> pwd.struct_passwd:
    return pwd.getpwuid(Path(course).stat().st_uid)


def _env(state: str | Path, who: pwd.struct_passwd) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TERM")}
    env.update(PATH=os.pathsep.join([venv_bin, "/usr/local/bin", "/usr/bin", "/bin"]), HOME=who.pw_dir,
               USER=who.pw_name, LOGNAME=who.pw_name,
               JUPYTER_CONFIG_PATH=str(Path(state) / "jupyter" / "instructor"))
    return env


def run_as_owner(course: str | Path, state: str | Path, argv: list[str]) -> int:
    """Run ``argv`` in the course root as its owner (directly when that is who is running)."""
    course = Path(course).resolve()
    who = owner(course)
    if not (Path(state) / "jupyter" / "instructor" / "nbgrader_config.py").exists():
        print(f"error: no hub settings in {state}/jupyter/instructor: start the hub once (make hub ROSTER=...), "
              "or pass the same HUB_STATE= as make hub", file=sys.stderr)
        return 2
    prefix: list[str] = []
    if os.geteuid() != who.pw_uid:
        if os.geteuid() != 0:
            print(f"error: {course} belongs to {who.pw_name}: run this as {who.pw_name} or with sudo", file=sys.stderr)
            return 2
        prefix = ["setpriv", f"--reuid={who.pw_uid}", f"--regid={who.pw_gid}", "--init-groups", "--"]
    print("$ " + " ".join(argv) + (f"   (as {who.pw_name})" if prefix else ""), flush=True)
    return subprocess.run(prefix + argv, cwd=course, env=_env(state, who), check=False).returncode


def nbgrader(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "nbgrader"), *args]


def confirm_due(course: str | Path, lab: str, due: str | None, force: bool = False,
                ask: Callable[[str], str] | None = None) -> int:
    """0 when ``lab`` may be released with ``due``: a due date already past (given, or kept in the
    gradebook) is released only with ``force``, or when the instructor answers y on a terminal
    (``ask``: how to ask, default :func:`input` where stdin is a TTY). Otherwise 2, with the fix."""
    try:
        why = extensions.past_due(course, lab, due)
    except extensions.DeadlineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if why is None:
        return 0
    if force:
        print(f"warning: {why}; released anyway (FORCE=1)", flush=True)
        return 0
    if ask is None and sys.stdin.isatty():
        ask = input
    if ask is None:
        print(f"error: {why}. Not released: give a later DUE=, or FORCE=1 to release it anyway "
              "(make hub-release LAB=... DUE=... FORCE=1); one student's extra time: make hub-extend", file=sys.stderr)
        return 2
    print(f"warning: {why}", flush=True)
    try:
        answer = ask("Release it anyway? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return 0
    print(f"not released: {lab} is as it was (FORCE=1 releases without asking)", file=sys.stderr)
    return 2


def release(course: str | Path, state: str | Path, lab: str, due: str | None = None, force: bool = False,
            ask: Callable[[str], str] | None = None) -> int:
    """Generate the student version of ``lab`` and release it to the exchange (a due date already
    past: only with ``force`` or the instructor's y, :func:`confirm_due`)."""
    if (rc := confirm_due(course, lab, due, force, ask)) != 0:
        return rc
    steps = [[sys.executable, "-m", "gpulab.course", "release", "--course", ".", "--lab", lab]]
    if due:
        steps.append(nbgrader("db", "assignment", "add", lab, f"--duedate={extensions.shown(extensions.parse_when(due))}"))
    steps.append(nbgrader("release_assignment", lab, "--force"))
    for argv in steps:
        if (rc := run_as_owner(course, state, argv)) != 0:
            return rc
    settle(course)
    return 0


def extend(course: str | Path, state: str | Path | None, lab: str, student: str, until: str) -> int:
    """One student's extension of ``lab``'s due date, kept in the course's gradebook, where
    ``make grade`` honours it (:mod:`gpulab.hub.extensions`)."""
    from nbgrader.api import InvalidEntry
    from sqlalchemy.exc import DBAPIError

    try:
        line = extensions.extend(course, lab, student, until, state)
    except extensions.DeadlineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (InvalidEntry, DBAPIError, PermissionError) as err:
        print(f"error: cannot write {Path(course) / 'gradebook.db'} ({str(err).splitlines()[0]}): run this as the "
              f"course's owner ({owner(course).pw_name}) or with sudo", file=sys.stderr)
        return 2
    settle(course)  # as root: what sqlite wrote stays the course owner's, closed
    print(line)
    return 0


def collect(course: str | Path, state: str | Path, lab: str) -> int:
    """Collect each student's latest submission of ``lab`` from the exchange into ``submitted/``
    (``--update``: a later submission replaces an earlier one)."""
    rc = run_as_owner(course, state, nbgrader("collect", lab, "--update"))
    settle(course)  # nbgrader copies the inbound's 0777 folders: closed again, the instructors' only
    return rc


def feedback(course: str | Path, state: str | Path, lab: str) -> int:
    """The kit's feedback of ``lab`` (hidden tests removed, checked), released to the exchange."""
    given = settle(course)  # what make grade (as root) wrote: the course owner's, closed
    if given:
        print(f"closed {given} path(s) written in {course}: {owner(course).pw_name}'s, nothing for others")
    rc = run_as_owner(course, state, [sys.executable, "-m", "gpulab.course", "feedback", "--course", ".", "--lab", lab])
    if rc != 0:
        return rc
    pair_with_submissions(course, lab)
    rc = run_as_owner(course, state, nbgrader("release_feedback", lab))
    settle(course)
    return rc


# what nbgrader's release_feedback reads beside each page to address it to the submission it answers
SUBMISSION_FILES = ("timestamp.txt", "submission_secret.txt")


def pair_with_submissions(course: str | Path, lab: str) -> int:
    """Copy each submission's ``timestamp.txt`` and ``submission_secret.txt`` next to its feedback
    page where the page has none; returns how many were copied.

    nbgrader's ``release_feedback`` names each page in the exchange by a hash of the submission's
    secret, which only the submitting student's ``fetch_feedback`` can compute (so nobody fetches
    another's page); it reads the secret from the feedback folder."""
    course, copied = Path(course), 0
    for page_dir in (course / "feedback").glob(f"*/{lab}"):
        for page in page_dir.glob("*.html"):  # its copy in the exchange keeps this mode: the student reads it
            page.chmod(0o644)                 # (here its folder keeps it to the instructors)
        submitted = course / "submitted" / page_dir.parent.name / lab
        for name in SUBMISSION_FILES:
            if not (page_dir / name).exists() and (submitted / name).is_file():
                (page_dir / name).write_bytes((submitted / name).read_bytes())
                if os.geteuid() == 0:  # written by root: the course owner's, as the page beside it
                    st = page_dir.stat()
                    os.chown(page_dir / name, st.st_uid, st.st_gid)
                copied += 1
    return copied
