"""The roster of ``make hub``: every problem reported at once, with its line and fix; accounts checked
against the machine before anything is created."""

from __future__ import annotations

import pwd
from types import SimpleNamespace

import pytest

from gpulab.hub.roster import RosterError, check_accounts, parse, read

GOOD = "user,role\nalice,student\nbob,Student\n\n# a comment\nmnemo,instructor\n"


def test_a_roster_with_a_header_comments_and_blank_lines() -> None:
    r = parse(GOOD)
    assert r.users == ["alice", "bob", "mnemo"]
    assert [p.user for p in r.students] == ["alice", "bob"]
    assert [p.user for p in r.instructors] == ["mnemo"]
    assert r.role("bob") == "student" and r.role("nobody") is None
    assert parse("alice,student\nmnemo,instructor\n").users == ["alice", "mnemo"]  # no header


def test_every_problem_is_reported_at_once_with_its_line() -> None:
    text = "user,role\nalice,student\nAlice,student\nbob smith,student\n1x,student\ncarol,teacher\ndan\nmnemo,instructor\n"
    with pytest.raises(RosterError) as err:
        parse(text)
    msg = str(err.value)
    assert "nothing was created or changed" in msg
    assert "line 3: 'Alice' is already on line 2" in msg          # duplicate, differing only in case
    assert "line 3: 'Alice' is not a valid account name; use alice" in msg
    assert "line 4: 'bob smith' is not a valid account name" in msg
    assert "line 5: '1x' is not a valid account name" in msg
    assert "line 6: role 'teacher' of 'carol' is not one of student, instructor" in msg
    assert "line 7: 'dan' has 1 field(s)" in msg
    assert len(err.value.problems) == 6


@pytest.mark.parametrize("text, why", [("alice,student\n", "no instructor"), ("mnemo,instructor\n", "no student"),
                                       ("", "no instructor")])
def test_a_class_needs_an_instructor_and_a_student(text: str, why: str) -> None:
    with pytest.raises(RosterError, match=why):
        parse(text)


def test_a_missing_file_names_the_fix(tmp_path) -> None:
    with pytest.raises(RosterError, match="ROSTER="):
        read(tmp_path / "nope.csv")
    (tmp_path / "r.csv").write_text(GOOD)
    assert read(tmp_path / "r.csv").users == ["alice", "bob", "mnemo"]


def _accounts(table: dict[str, int]):
    def getpwnam(name: str):
        if name not in table:
            raise KeyError(name)
        return SimpleNamespace(pw_uid=table[name])
    return getpwnam


def test_existing_accounts_are_used_and_missing_ones_need_the_flag() -> None:
    r = parse(GOOD)
    got = check_accounts(r, create_users=True, getpwnam=_accounts({"alice": 1001}))
    assert got.existing == ("alice",) and got.missing == ("bob", "mnemo")
    with pytest.raises(RosterError, match="CREATE_USERS=1") as err:
        check_accounts(r, create_users=False, getpwnam=_accounts({"alice": 1001}))
    assert "bob, mnemo" in str(err.value)
    assert check_accounts(r, False, _accounts({"alice": 1001, "bob": 1002, "mnemo": 1003})).missing == ()


def test_a_system_account_is_refused() -> None:
    r = parse("user,role\nroot,student\nwww-data,student\nmnemo,instructor\n")
    with pytest.raises(RosterError) as err:
        check_accounts(r, create_users=True, getpwnam=pwd.getpwnam)
    assert "'root' is an existing system account (uid 0)" in str(err.value)
    assert "'www-data' is an existing system account" in str(err.value)
