"""The course's private part, closed by its modes (gpulab/accounts/private.py), on scratch folders."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpulab.accounts import private
from gpulab.hub import site


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def _course(tmp_path: Path) -> Path:
    course = tmp_path / "course"
    (course / "source" / "00_setup").mkdir(parents=True)
    (course / "source" / "00_setup" / "00_setup.ipynb").write_text("{}")
    (course / "gradebook.db").write_text("")
    inbound_copy = course / "submitted" / "ann" / "00_setup"  # as nbgrader collect copies it: 0777
    inbound_copy.mkdir(parents=True)
    (inbound_copy / "timestamp.txt").write_text("2026-12-02")
    for p in [course, *course.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    inbound_copy.chmod(0o777)
    (course / "run.sh").write_text("#!/bin/sh\n")
    (course / "run.sh").chmod(0o755)
    return course


def test_an_open_course_is_named_path_by_path_with_the_fix(tmp_path) -> None:
    course = _course(tmp_path)
    why = private.exposed([course], ["nobody"])
    assert len(why) == 1 and str(course) in why[0] and "chmod -R o-rwx" in why[0], why


def test_closing_the_course_takes_every_bit_of_the_others_and_keeps_the_owners(tmp_path) -> None:
    course = _course(tmp_path)
    changed = private.close_course(course)
    assert changed >= 7
    assert private.exposed([course], ["nobody"]) == []
    for p in [course, *course.rglob("*")]:
        assert not _mode(p) & 0o007, (p, oct(_mode(p)))
        assert _mode(p) == (0o2770 if p.is_dir() else 0o770 if p.name == "run.sh" else 0o660), (p, oct(_mode(p)))
    assert private.close_course(course) == 0  # closed stays closed: nothing to change


def test_settle_closes_what_a_later_step_wrote_and_leaves_an_open_course_alone(tmp_path) -> None:
    course = _course(tmp_path)
    assert private.settle(course) == 0 and _mode(course) == 0o755  # a laptop's course: not ours to close
    private.close_course(course)
    late = course / "submitted" / "bob" / "00_setup"
    late.mkdir(parents=True)
    late.chmod(0o777)
    (late / "00_setup.ipynb").write_text("{}")
    (late / "00_setup.ipynb").chmod(0o666)
    assert private.settle(course) >= 2
    assert _mode(late) == 0o2770 and _mode(late / "00_setup.ipynb") == 0o660


def test_the_kits_private_folders_and_the_hubs_database_lose_the_others_bits(tmp_path) -> None:
    kit, state = tmp_path / "kit", tmp_path / "state"
    for d in ("notebooks/source", "tests", ".venv/bin", "gpulab"):
        (kit / d).mkdir(parents=True)
        (kit / d).chmod(0o755)
    state.mkdir()
    db = site.make_database(state)
    assert _mode(db) == 0o600 and db.stat().st_size == 0
    paths = private.private_paths(tmp_path / "course", state, kit)
    assert kit / "notebooks" in paths and kit / "tests" in paths and db in paths
    assert kit / ".venv" not in paths and kit / "gpulab" not in paths  # every server runs them
    private.close_others([p for p in paths if p.exists()])
    assert private.exposed([p for p in paths if p.exists()], ["nobody"]) == []
    assert _mode(kit / ".venv") == 0o755 and os.access(kit / "gpulab", os.R_OK)
