"""Deadlines an instructor can manage: a lab's due date, and a student's extension of it.

Both live where nbgrader keeps them, in the course's ``gradebook.db`` (the course's private part):
the due date is the lab's (``make hub-release DUE=``), and an extension is the student's
``SubmittedAssignment.extension``, the time added to it (``make hub-extend``). ``make grade``
copies the gradebook into each grading copy, where nbgrader's autograde measures how late a
submission is against the student's own deadline (the due date plus the extension), so a
submission before it gets no late penalty. The extension is a length of time, as nbgrader keeps
it: a later ``DUE=`` moves the student's deadline with it (give the extension again).

    make hub-extend LAB=00_setup STUDENT=alice UNTIL="2026-10-03 17:00:00 UTC"
    make hub-extend LAB=00_setup STUDENT=alice UNTIL=none      # the extension removed
"""

from __future__ import annotations

import datetime as dt
import json
import re
import warnings
from pathlib import Path

from sqlalchemy.exc import SAWarning

from gpulab.accounts import students

DATE_EXAMPLE = '"2026-10-01 17:00:00 UTC"'


class DeadlineError(ValueError):
    """A due date or an extension that cannot be used, naming the fix."""


def parse_when(text: str, what: str = "DUE") -> dt.datetime:
    """``text`` as a moment, in naive UTC as nbgrader keeps dates: "2026-10-01 17:00:00 UTC",
    "... +0200", "... Asia/Seoul"; without a zone, UTC. (nbgrader's own parse_utc reads "+0200" as
    200 seconds and an unknown zone as UTC, so the release hands nbgrader this one's UTC reading.)"""
    import dateutil.parser
    import dateutil.tz

    parts = text.split()
    zone = None
    if len(parts) == 3 and not re.fullmatch(r"[+-]\d\d:?\d\d|Z", parts[2]):
        zone = dateutil.tz.gettz(parts[2])
        if zone is None:
            raise DeadlineError(f"{what}={text!r}: no time zone called {parts[2]!r}; write UTC, an offset (+0900) "
                                "or a zone's name (Asia/Seoul), e.g. " + DATE_EXAMPLE)
        text = " ".join(parts[:2])
    try:
        when = dateutil.parser.parse(text)
    except (ValueError, OverflowError) as err:
        raise DeadlineError(f"{what}={text!r} is not a date ({err}); write it as {DATE_EXAMPLE}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone or dt.timezone.utc)
    return when.astimezone(dt.timezone.utc).replace(tzinfo=None)


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def shown(when: dt.datetime) -> str:
    return f"{when:%Y-%m-%d %H:%M:%S} UTC"


def _db_url(course: Path) -> str:
    return f"sqlite:///{Path(course) / 'gradebook.db'}"


def stored_due(course: str | Path, lab: str) -> dt.datetime | None:
    """The lab's due date in the course's gradebook (None: no gradebook, no such lab, or no date)."""
    from nbgrader.api import Gradebook, MissingEntry

    if not (Path(course) / "gradebook.db").is_file():
        return None
    with Gradebook(_db_url(Path(course)), course_id="") as gb:
        try:
            return gb.find_assignment(lab).duedate
        except MissingEntry:
            return None


def past_due(course: str | Path, lab: str, due: str | None) -> str | None:
    """Why releasing ``lab`` now would make every submission late: its due date (``due``, or the
    gradebook's from an earlier release when none is given) is already past. None when it is
    ahead, or there is none."""
    when = parse_when(due) if due else stored_due(course, lab)
    if when is None or when > now():
        return None
    hours = (now() - when).total_seconds() / 3600
    source = "" if due else " (kept in the gradebook from an earlier release)"
    return (f"{lab}'s due date {shown(when)}{source} is already past ({hours:.1f} h ago): every submission from "
            "now on is late and gets the course's late penalty (c.LateSubmissionPlugin in nbgrader_config.py)")


def roster_students(state: str | Path | None) -> set[str] | None:
    """The students of the running hub's roster (``<state>/plan.json``), None where it cannot be read."""
    if state is None:
        return None
    try:
        plan = json.loads((Path(state) / "plan.json").read_text())
    except (OSError, ValueError):
        return None
    return {user for user, role in plan.get("roster", []) if role == "student"}


def _known(gb, course: Path, student: str, state: str | Path | None) -> bool:
    if any(s.id == students.alias(student) for s in gb.students):
        return True
    if (course / "submitted" / student).is_dir():
        return True
    return student in (roster_students(state) or set())


def extend(course: str | Path, lab: str, student: str, until: str, state: str | Path | None = None) -> str:
    """Give ``student`` until ``until`` (a date, or "none" to remove the extension) to submit
    ``lab``; returns what was done, in a line. The student must be in the gradebook, in
    ``submitted/`` or on the hub's roster (``state``), so a misspelt name is refused.

    Raises:
        DeadlineError: no gradebook, no such lab, no due date, an unknown student, a bad date or
            one that is not after the due date.
    """
    from nbgrader.api import Gradebook, MissingEntry

    course = Path(course).resolve()
    for name, value in (("LAB", lab), ("STUDENT", student), ("UNTIL", until)):
        if not value or not value.strip():
            raise DeadlineError(f"{name}= is missing: make hub-extend LAB=00_setup STUDENT=alice UNTIL={DATE_EXAMPLE}")
    if not (course / "gradebook.db").is_file():
        raise DeadlineError(f"{course} has no gradebook.db: release the lab first (make hub-release LAB={lab} DUE=...)")
    remove = until.strip().lower() == "none"
    with Gradebook(_db_url(course), course_id="") as gb:
        try:
            due = gb.find_assignment(lab).duedate
        except MissingEntry:
            raise DeadlineError(f"the gradebook knows no lab {lab!r}: release it first "
                                f"(make hub-release LAB={lab} DUE=...)") from None
        if due is None and not remove:
            raise DeadlineError(f"{lab} has no due date, so nothing is late and there is nothing to extend; "
                                f"set one with make hub-release LAB={lab} DUE={DATE_EXAMPLE}")
        if not _known(gb, course, student, state):
            raise DeadlineError(f"no student {student!r}: not in {course / 'gradebook.db'}, {course / 'submitted'} "
                                "or the hub's roster; check the name (the roster's user column), or run this with "
                                "sudo so that the hub's roster can be read")
        name = students.alias(student)
        if remove:
            try:
                gb.find_submission(lab, name).extension = None
                gb.db.commit()
            except MissingEntry:
                pass  # nothing recorded for this student: no extension to remove
            return f"{student} has no extension of {lab}: the due date {shown(due) if due else '(none)'} holds"
        when = parse_when(until, "UNTIL")
        if when <= due:
            raise DeadlineError(f"UNTIL={until!r} is not after {lab}'s due date {shown(due)}: an extension moves "
                                "a student's deadline later (UNTIL=none removes one)")
        with warnings.catch_warnings():  # nbgrader's add_submission: SQLAlchemy's autoflush warning (gradebook.merge)
            warnings.simplefilter("ignore", category=SAWarning)
            gb.update_or_create_student(name)
            gb.update_or_create_submission(lab, name, extension=when - due)
    return (f"{student} may submit {lab} until {shown(when)} without a late penalty "
            f"({(when - due).total_seconds() / 3600:.1f} h after the due date {shown(due)})")
