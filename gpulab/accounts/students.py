"""Student ids as they come (an LMS export, the exchange), made safe where the grader uses them.

nbgrader reads an id as a command-line value and a glob pattern (``-rf``, ``star*``), a newline
breaks a log line, and a spreadsheet runs a cell that starts with ``=``, ``+``, ``-`` or ``@``. So
each submission is graded under :func:`alias` (the id itself when plain), which is what nbgrader's
folders and gradebook hold; ``grades.csv`` has the id as written, formula prefixes escaped.
"""

from __future__ import annotations

import hashlib
import re

PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}\Z")
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def plain(student: str) -> bool:
    """Whether ``student`` can be given to nbgrader as it is."""
    return bool(PLAIN.match(student)) and ".." not in student


def alias(student: str) -> str:
    """The name a submission is graded under in its grading copy (the id itself when plain)."""
    if plain(student):
        return student
    return "student-" + hashlib.sha256(student.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def csv_cell(text: str) -> str:
    """``text`` as a spreadsheet will show it, never run it (OWASP's CSV injection advice: a leading ')."""
    return "'" + text if text.startswith(FORMULA) else text


def from_csv(cell: str) -> str:
    """The id :func:`csv_cell` escaped, as it was."""
    return cell[1:] if cell.startswith("'") and cell[1:].startswith(FORMULA) else cell


def shown(student: str) -> str:
    """The id on one line (for a table or a log)."""
    return student if plain(student) else repr(student)
