"""Deadlines an instructor can manage (gpulab/hub/extensions.py, loop.release): a due date already
past is released only when confirmed, and a student's extension is kept in nbgrader's own gradebook
(real sqlite gradebooks in tmp_path)."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from gpulab.hub import __main__ as hub_main
from gpulab.hub import extensions, loop

LAB = "00_setup"
DUE = dt.datetime(2026, 10, 1, 17, 0, 0)


@pytest.fixture(autouse=True)
def _alembic_on_path(monkeypatch) -> None:
    """nbgrader stamps a new gradebook by running ``alembic``, found on PATH (.venv/bin, as under make)."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _course(tmp_path: Path, due: dt.datetime | None = DUE, students: tuple[str, ...] = ("ann",)) -> Path:
    course = tmp_path / "course"
    course.mkdir()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="") as gb:
        gb.add_assignment(LAB, duedate=due)
        for s in students:
            gb.add_student(s)
    return course


def _submission(course: Path, student: str):
    gb = Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="")
    return gb, gb.find_submission(LAB, student)


# ---- extensions --------------------------------------------------------------------------------

def test_an_extension_moves_the_students_deadline_in_nbgraders_gradebook(tmp_path) -> None:
    course = _course(tmp_path)
    line = extensions.extend(course, LAB, "ann", "2026-10-03 17:00:00 UTC")
    assert line == ("ann may submit 00_setup until 2026-10-03 17:00:00 UTC without a late penalty "
                    "(48.0 h after the due date 2026-10-01 17:00:00 UTC)")
    gb, sub = _submission(course, "ann")
    with gb:
        assert sub.extension == dt.timedelta(days=2) and sub.duedate == dt.datetime(2026, 10, 3, 17)
        sub.timestamp = dt.datetime(2026, 10, 2, 9)  # after the lab's due date, before hers
        assert sub.total_seconds_late == 0
        sub.timestamp = dt.datetime(2026, 10, 3, 18, 30)
        assert sub.total_seconds_late == 1.5 * 3600
    # given again, it replaces the first (nbgrader's extensions do not stack); a zone is honoured
    extensions.extend(course, LAB, "ann", "2026-10-02 19:00:00 +0200")
    gb, sub = _submission(course, "ann")
    with gb:
        assert sub.duedate == dt.datetime(2026, 10, 2, 17)
    assert extensions.extend(course, LAB, "ann", "none").startswith("ann has no extension of 00_setup")
    gb, sub = _submission(course, "ann")
    with gb:
        assert sub.extension is None and sub.duedate == DUE


def test_a_student_of_the_roster_or_of_submitted_may_be_extended_a_misspelt_one_not(tmp_path) -> None:
    course = _course(tmp_path, students=())
    state = tmp_path / "state"
    state.mkdir()
    (state / "plan.json").write_text(json.dumps({"roster": [["bea", "student"], ["ivo", "instructor"]]}))
    (course / "submitted" / "cal" / LAB).mkdir(parents=True)
    for who in ("bea", "cal"):  # not in the gradebook yet: graded later, the extension waits there
        extensions.extend(course, LAB, who, "2026-10-02 17:00:00 UTC", state)
        gb, sub = _submission(course, who)
        with gb:
            assert sub.extension == dt.timedelta(days=1)
    for who in ("baa", "ivo"):  # a typo, and an instructor
        with pytest.raises(extensions.DeadlineError, match=f"no student '{who}'.*check the name"):
            extensions.extend(course, LAB, who, "2026-10-02 17:00:00 UTC", state)


@pytest.mark.parametrize("until, due, why", [
    ("2026-09-30 17:00:00 UTC", DUE, "is not after 00_setup's due date 2026-10-01 17:00:00 UTC.*UNTIL=none"),
    ("2026-10-01 17:00:00 UTC", DUE, "is not after"),
    ("next friday-ish", DUE, r"UNTIL='next friday-ish' is not a date.*\"2026-10-01 17:00:00 UTC\""),
    ("2026-10-03 17:00:00 UTC", None, "has no due date.*make hub-release LAB=00_setup DUE="),
    ("", DUE, "UNTIL= is missing: make hub-extend LAB=00_setup STUDENT=alice UNTIL="),
])
def test_a_bad_extension_is_refused_naming_the_fix(tmp_path, until, due, why) -> None:
    course = _course(tmp_path, due=due)
    with pytest.raises(extensions.DeadlineError, match=why):
        extensions.extend(course, LAB, "ann", until)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="") as gb:
        assert not gb.find_assignment(LAB).submissions, "nothing was written"


def test_hub_extend_says_what_it_did_and_refuses_an_unknown_lab(tmp_path, capsys) -> None:
    course = _course(tmp_path)
    args = ["--course", str(course), "--state", str(tmp_path / "state"), "--student", "ann"]
    assert hub_main.main(["extend", "--lab", LAB, *args, "--until", "2026-10-01 23:00:00 UTC"]) == 0
    assert "ann may submit 00_setup until 2026-10-01 23:00:00 UTC without a late penalty (6.0 h" in capsys.readouterr().out
    assert hub_main.main(["extend", "--lab", "99_none", *args, "--until", "2026-10-01 23:00:00 UTC"]) == 2
    assert "knows no lab '99_none': release it first (make hub-release LAB=99_none" in capsys.readouterr().err
    with pytest.raises(extensions.DeadlineError, match="has no gradebook.db: release the lab first"):
        extensions.extend(tmp_path, LAB, "ann", "2026-10-03 17:00:00 UTC")


@pytest.mark.parametrize("text, utc", [
    ("2026-10-01 17:00:00 UTC", dt.datetime(2026, 10, 1, 17)),
    ("2026-10-01 17:00", dt.datetime(2026, 10, 1, 17)),  # no zone: UTC, as nbgrader reads it
    ("2026-10-02 02:00:00 +0900", dt.datetime(2026, 10, 1, 17)),  # nbgrader's parse_utc: 900 seconds
    ("2026-10-02 02:00:00 Asia/Seoul", dt.datetime(2026, 10, 1, 17)),
])
def test_dates_are_read_in_utc_whatever_zone_they_name(text, utc) -> None:
    assert extensions.parse_when(text) == utc


def test_a_zone_nobody_knows_is_refused_not_read_as_utc() -> None:
    with pytest.raises(extensions.DeadlineError, match="no time zone called 'KST'.*Asia/Seoul"):
        extensions.parse_when("2026-10-02 02:00:00 KST")


# ---- a release whose due date is already past --------------------------------------------------

@pytest.fixture
def steps(monkeypatch) -> list[list[str]]:
    """What loop.release would run as the course's owner (recorded, each step succeeding)."""
    ran: list[list[str]] = []
    monkeypatch.setattr(loop, "run_as_owner", lambda course, state, argv: ran.append(argv) or 0)
    monkeypatch.setattr(loop, "settle", lambda course: 0)
    return ran


def _release(course: Path, *extra: str) -> int:
    return hub_main.main(["release", "--lab", LAB, "--course", str(course), "--state", str(course / "state"), *extra])


def _past() -> str:
    return extensions.shown(extensions.now() - dt.timedelta(hours=2, minutes=30))


def test_a_past_due_date_is_refused_off_a_terminal_without_force(tmp_path, steps, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # a pipe, not a person: nobody to ask
    assert _release(tmp_path, "--due", _past()) == 2
    err = capsys.readouterr().err
    assert "is already past (2.5 h ago): every submission from now on is late" in err, err
    assert "Not released" in err and "FORCE=1" in err, err
    assert steps == [], "nothing was generated, dated or released"


def test_a_past_due_date_is_released_with_force(tmp_path, steps, capsys) -> None:
    due = _past()
    assert _release(tmp_path, "--due", due, "--force") == 0
    assert "is already past (2.5 h ago)" in capsys.readouterr().out
    assert steps[0][-5:] == ["release", "--course", ".", "--lab", LAB], steps  # generated, then dated, released
    assert [argv[-3:] for argv in steps[1:]] == [["add", LAB, f"--duedate={due}"],
                                                ["release_assignment", LAB, "--force"]], steps


def test_on_a_terminal_the_instructor_is_asked_and_only_y_releases(tmp_path, steps, capsys) -> None:
    for answer, rc in (("", 2), ("n", 2), ("yes", 0)):
        asked: list[str] = []
        got = loop.release(tmp_path, tmp_path / "state", LAB, _past(),
                           ask=lambda q, answer=answer: asked.append(q) or answer)
        assert got == rc and asked == ["Release it anyway? [y/N] "], (answer, got, asked)
    assert len(steps) == 3, "released once, on the yes"
    assert "not released: 00_setup is as it was" in capsys.readouterr().err


def test_the_gradebooks_past_due_date_counts_when_no_due_is_given(tmp_path, steps, monkeypatch, capsys) -> None:
    course = _course(tmp_path, due=extensions.now() - dt.timedelta(days=1))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert _release(course) == 2 and steps == []
    assert "(kept in the gradebook from an earlier release) is already past (24.0 h ago)" in capsys.readouterr().err
    future = extensions.shown(extensions.now() + dt.timedelta(days=7))
    assert _release(course, "--due", future) == 0  # a new, later due date: nothing to confirm
    assert steps[1][-2:] == [LAB, f"--duedate={future}"]


def test_the_due_date_reaches_nbgrader_in_utc(tmp_path, steps) -> None:
    assert _release(tmp_path, "--due", "2099-10-02 02:00:00 +0900") == 0
    assert steps[1][-1] == "--duedate=2099-10-01 17:00:00 UTC", steps


def test_a_due_date_that_is_not_a_date_is_refused_before_anything_runs(tmp_path, steps, capsys) -> None:
    assert _release(tmp_path, "--due", "soon") == 2 and steps == []
    assert "DUE='soon' is not a date" in capsys.readouterr().err
