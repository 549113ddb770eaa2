"""The local accounts of the roster: created only when asked, never changed when they exist.

:func:`create` makes the missing accounts with ``useradd`` (a home of mode 0700, so classmates cannot
read each other's work, and a random password set with ``chpasswd``) and writes the new passwords
to a file only root can read, for the instructor to hand out. If any step fails, the accounts made
in this call are removed again: a roster is either created whole or not at all. Existing accounts
are never touched: not their password, home, groups or shell.
"""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
from pathlib import Path


class UserError(RuntimeError):
    """An account could not be created (the ones created before it have been removed again)."""


def _run(argv: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, text=True, capture_output=True, check=False)
    if done.returncode != 0:
        raise UserError(f"`{' '.join(argv)}` failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")


def exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def create(users: list[str] | tuple[str, ...], passwords: dict[str, str] | None = None,
           password_file: str | Path | None = None, comment: str = "") -> dict[str, str]:
    """Create ``users`` (none of them may exist yet); return ``{user: password}``.

    Args:
        users: the accounts to make.
        passwords: a password per user (default: a random one each).
        password_file: where to write ``user,password`` lines (mode 0600, root's); appended to.
        comment: the accounts' comment (GECOS) field, e.g. who made them.

    Raises:
        UserError: not root, a user that exists, or a failing ``useradd``/``chpasswd``; every
            account this call created has been removed again.
    """
    if os.geteuid() != 0:
        raise UserError("creating accounts needs root: run `sudo make hub ...`")
    clash = [u for u in users if exists(u)]
    if clash:
        raise UserError(f"{', '.join(clash)} already exist(s); existing accounts are never changed")
    made: list[str] = []
    chosen = {u: (passwords or {}).get(u) or secrets.token_urlsafe(12) for u in users}
    try:
        for u in users:
            _run(["useradd", "--create-home", "--shell", "/bin/bash", "-K", "HOME_MODE=0700",
                  "--comment", comment or "gpulab course (make hub)", u])
            made.append(u)
            os.chmod(pwd.getpwnam(u).pw_dir, 0o700)  # older useradd ignores HOME_MODE
        if users:
            _run(["chpasswd"], stdin="".join(f"{u}:{chosen[u]}\n" for u in users))
        if password_file and users:
            path = Path(password_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as f:
                f.writelines(f"{u},{chosen[u]}\n" for u in users)
            os.chmod(path, 0o600)
    except (OSError, UserError) as err:
        remove(made)
        raise UserError(f"{err}; removed the {len(made)} account(s) made before it, nothing else changed") from err
    return chosen


def remove(users: list[str] | tuple[str, ...]) -> list[str]:
    """Remove accounts and their homes (the tests' clean-up; ``make hub`` never removes anyone).
    Their processes are killed first. Returns the users removed."""
    gone = []
    for u in users:
        if not exists(u):
            continue
        subprocess.run(["pkill", "-KILL", "-u", u], capture_output=True, check=False)
        for _ in range(3):  # userdel refuses while a process of the user is still exiting
            if subprocess.run(["userdel", "--remove", u], capture_output=True, check=False).returncode in (0, 12):
                break
            subprocess.run(["pkill", "-KILL", "-u", u], capture_output=True, check=False)
        if not exists(u):
            gone.append(u)
    return gone
