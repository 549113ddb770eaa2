"""gpulab.course.readguard: the read grant covers everything but the denied folders."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_readable_paths_grant_everything_but_the_denied_folders(tmp_path: Path) -> None:
    from gpulab.course.readguard import readable_paths
    (tmp_path / "course" / "source").mkdir(parents=True)
    (tmp_path / "course" / "release").mkdir()
    (tmp_path / "course" / "gradebook.db").write_text("")
    (tmp_path / "lib").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "course" / "source")
    grant = readable_paths([str(tmp_path / "course" / "source"), str(tmp_path / "course" / "gradebook.db")])
    assert str(tmp_path / "lib") in grant and str(tmp_path / "course" / "release") in grant
    assert not any(g.startswith(str(tmp_path / "course" / "source")) for g in grant)
    assert str(tmp_path / "course") not in grant and str(tmp_path) not in grant  # ancestors are expanded, not granted
    assert str(tmp_path / "course" / "gradebook.db") not in grant and str(tmp_path / "link") not in grant
    assert "/usr" in grant
    with pytest.raises(ValueError, match="could not load Python"):
        readable_paths(["/"])


def test_repository_secrets_name_git_and_every_checkouts_course(tmp_path: Path) -> None:
    from gpulab.course.readguard import repository_secrets
    repo = Path(__file__).resolve().parents[2]
    # a course copied outside any repository still hides the checkout gpulab runs from
    found = repository_secrets(tmp_path)
    if not (repo / ".git").exists():
        pytest.skip("gpulab is not running from a git checkout")
    assert repo / ".git" in found and repo / "notebooks" in found
    assert any(p.name == ".git" and p.is_dir() for p in found)  # the repository's own git folder
    assert repo / "gpulab" not in found and all(not (repo / "gpulab").is_relative_to(p) for p in found)


def test_allowed_folders_inside_an_unlistable_denied_folder_are_still_granted(tmp_path: Path, monkeypatch) -> None:
    # a kernel under a uid of its own may pass through the grading folder (0711) but not list it:
    # its own folders inside must be granted by name
    import os

    from gpulab.course import readguard
    grading = tmp_path / "grading"
    for d in ("lab/me/tmp", "lab/me/work", "lab/mate/tmp"):
        (grading / d).mkdir(parents=True)
    real_scandir = os.scandir

    def scandir(path):  # os.scandir's signature
        if str(path).startswith(str(grading)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(readguard.os, "scandir", scandir)
    mine = [str(grading / "lab/me/tmp"), str(grading / "lab/me/work")]
    grant = readguard.readable_paths([str(grading)], mine)
    assert [g for g in grant if g.startswith(str(grading))] == mine
