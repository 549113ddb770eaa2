"""The class roster: one line per person, ``user,role``, checked whole before anything is created.

    # roster.csv: lines starting with # and blank lines are ignored; the header line is optional
    user,role
    alice,student
    bob,student
    mnemo,instructor

A user name is a local account name (``useradd``'s default rule: a lowercase letter or ``_``, then
lowercase letters, digits, ``_`` or ``-``, at most 32 characters). Every problem of the file is
collected and reported at once, each with its line number and the fix, so one edit fixes them all;
:func:`check_accounts` then compares the roster with the machine's accounts. Nothing is created
until both have passed (:mod:`gpulab.accounts.users`).
"""

from __future__ import annotations

import csv
import io
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

ROLES = ("student", "instructor")
NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# accounts below this uid are the system's (Debian's login.defs UID_MIN): never a student or instructor
UID_MIN = 1000


class RosterError(ValueError):
    """The roster cannot be used as it is; the message lists every problem and its fix."""

    def __init__(self, problems: list[str], source: str = "the roster") -> None:
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s), nothing was created or changed:\n"
                         + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class Person:
    """One line of the roster."""

    user: str
    role: str
    line: int = 0

    @property
    def instructor(self) -> bool:
        return self.role == "instructor"


@dataclass(frozen=True)
class Roster:
    """The people of one course, in the roster's order (the order GPUs are handed out in)."""

    people: tuple[Person, ...]

    @property
    def students(self) -> list[Person]:
        return [p for p in self.people if not p.instructor]

    @property
    def instructors(self) -> list[Person]:
        return [p for p in self.people if p.instructor]

    def role(self, user: str) -> str | None:
        return next((p.role for p in self.people if p.user == user), None)

    @property
    def users(self) -> list[str]:
        return [p.user for p in self.people]


def parse(text: str, source: str = "the roster") -> Roster:
    """Parse a roster's text; raise :class:`RosterError` listing every problem.

    Raises:
        RosterError: duplicates (also differing only in case), invalid names, unknown roles, a line
            without exactly two fields, no instructor or no student.
    """
    problems: list[str] = []
    people: list[Person] = []
    seen: dict[str, int] = {}
    rows = csv.reader(io.StringIO(text))
    for lineno, row in enumerate(rows, start=1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        if lineno == _first_line(text) and [c.lower() for c in cells] == ["user", "role"]:
            continue  # the header
        if len(cells) != 2:
            problems.append(f"line {lineno}: {','.join(row)!r} has {len(cells)} field(s); write `user,role`")
            continue
        user, role = cells[0], cells[1].lower()
        if not NAME.match(user):
            fix = user.lower() if NAME.match(user.lower()) else "letters a-z, digits, _ or -, starting with a letter"
            problems.append(f"line {lineno}: {user!r} is not a valid account name; use {fix}")
        if role not in ROLES:
            problems.append(f"line {lineno}: role {cells[1]!r} of {user!r} is not one of {', '.join(ROLES)}")
        key = user.lower()
        if key in seen:
            problems.append(f"line {lineno}: {user!r} is already on line {seen[key]}; list each person once")
            continue
        seen[key] = lineno
        people.append(Person(user, role, lineno))
    if not problems:
        if not any(p.instructor for p in people):
            problems.append("no instructor: add a line `youruser,instructor` (the instructor's tools need one)")
        if not any(not p.instructor for p in people):
            problems.append("no student: add a line `name,student` for each student")
    if problems:
        raise RosterError(problems, source)
    return Roster(tuple(people))


def _first_line(text: str) -> int:
    """The line number of the first line that is neither blank nor a comment (the header's place)."""
    for i, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.strip().startswith("#"):
            return i
    return 0


def read(path: str | Path) -> Roster:
    """Read and parse a roster file.

    Raises:
        RosterError: the file is missing, unreadable, or has problems (see :func:`parse`).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RosterError([f"cannot read it ({err.__class__.__name__}: {err}); pass ROSTER=path/to/roster.csv"],
                          str(path)) from None
    return parse(text, str(path))


@dataclass(frozen=True)
class AccountCheck:
    """The roster against this machine's accounts."""

    existing: tuple[str, ...]   # regular accounts, used as they are (never changed)
    missing: tuple[str, ...]    # to create (only with create_users)


def check_accounts(roster: Roster, create_users: bool, getpwnam=pwd.getpwnam) -> AccountCheck:
    """Which roster users exist; raise :class:`RosterError` for what cannot be used.

    A name that belongs to a system account (uid below :data:`UID_MIN`, e.g. ``root`` or
    ``www-data``) is refused: the hub would run that account's server. A missing user is an error
    unless ``create_users`` is set.
    """
    existing, missing, problems = [], [], []
    for p in roster.people:
        try:
            entry = getpwnam(p.user)
        except KeyError:
            missing.append(p.user)
            continue
        if entry.pw_uid < UID_MIN:
            problems.append(f"line {p.line}: {p.user!r} is an existing system account (uid {entry.pw_uid}); "
                            "a student or instructor needs an account of their own: rename them in the roster")
        else:
            existing.append(p.user)
    if missing and not create_users:
        problems.append(f"no local account for {', '.join(missing)}: create them (adduser), or let make hub create "
                        "them with CREATE_USERS=1 (random passwords, written to a file only root can read)")
    if problems:
        raise RosterError(problems)
    return AccountCheck(tuple(existing), tuple(missing))
