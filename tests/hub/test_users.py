"""Accounts of the roster: all created or none (the ones made are removed when a later one fails);
existing accounts are never touched. The commands are recorded, not run."""

from __future__ import annotations

import pytest

from gpulab.accounts import users


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A fake machine: root, an account table, useradd/chpasswd/userdel recorded."""
    accounts = {"taken"}
    calls: list[list[str]] = []
    fail_on = {"name": None}

    def run(argv, stdin=None):
        calls.append(argv)
        if argv[0] == "useradd":
            if argv[-1] == fail_on["name"]:
                raise users.UserError(f"useradd: cannot create {argv[-1]}")
            accounts.add(argv[-1])

    def remove(names):
        calls.append(["remove", *names])
        accounts.difference_update(names)
        return list(names)

    monkeypatch.setattr(users.os, "geteuid", lambda: 0)
    monkeypatch.setattr(users, "_run", run)
    monkeypatch.setattr(users, "exists", lambda u: u in accounts)
    monkeypatch.setattr(users, "remove", remove)
    monkeypatch.setattr(users.os, "chmod", lambda *a: None)
    monkeypatch.setattr(users.pwd, "getpwnam", lambda u: type("P", (), {"pw_dir": str(tmp_path / u)}))
    return accounts, calls, fail_on


def test_all_are_created_with_a_private_home_and_a_password(machine, tmp_path) -> None:
    accounts, calls, _ = machine
    got = users.create(["ann", "ben"], password_file=tmp_path / "pw.csv")
    assert {"ann", "ben"} <= accounts and set(got) == {"ann", "ben"}
    assert all("HOME_MODE=0700" in c for c in calls if c[0] == "useradd")
    assert ["chpasswd"] in calls
    assert (tmp_path / "pw.csv").read_text() == f"ann,{got['ann']}\nben,{got['ben']}\n"
    assert oct((tmp_path / "pw.csv").stat().st_mode & 0o777) == "0o600"


def test_a_failure_removes_the_accounts_made_before_it(machine) -> None:
    accounts, calls, fail_on = machine
    fail_on["name"] = "cat"
    with pytest.raises(users.UserError, match="removed the 2 account"):
        users.create(["ann", "ben", "cat"])
    assert accounts == {"taken"}
    assert ["remove", "ann", "ben"] in calls


def test_an_existing_account_is_never_touched(machine) -> None:
    accounts, calls, _ = machine
    with pytest.raises(users.UserError, match="taken already exist"):
        users.create(["ann", "taken"])
    assert calls == [] and accounts == {"taken"}


def test_creating_accounts_needs_root(monkeypatch) -> None:
    monkeypatch.setattr(users.os, "geteuid", lambda: 1000)
    with pytest.raises(users.UserError, match="sudo"):
        users.create(["ann"])
