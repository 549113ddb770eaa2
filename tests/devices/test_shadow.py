"""gpulab.devices.shadow: a folder named ``gpulab`` beside a script (a namespace package, no ``__init__.py``)
gets an ImportError naming the folder and the fix, in a fresh interpreter of this environment, as a
student's helper script meets it; without the folder, or with a real package there, nothing changes."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from gpulab.devices import shadow

HELPER = "from gpulab import MaskedReference\nprint('imported', MaskedReference.__module__)\n"


def _run(cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "helper.py").write_text(HELPER)
    return subprocess.run([sys.executable, "helper.py"], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_environment_installs_the_guard_at_start_up() -> None:
    pth = Path(sysconfig.get_paths()["purelib"]) / shadow.PTH_NAME
    assert pth.is_file(), f"{pth} is missing: run make setup (it runs python -m gpulab.devices.shadow install)"
    assert pth.read_text() == shadow.PTH_LINE


def test_a_folder_named_gpulab_beside_a_script_is_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "gpulab").mkdir()
    (tmp_path / "gpulab" / "notes.txt").write_text("the student's own files")
    proc = _run(tmp_path)
    assert proc.returncode != 0
    assert "unknown location" not in proc.stderr
    assert f"`import gpulab` found the folder {tmp_path / 'gpulab'}" in proc.stderr, proc.stderr
    assert f"before the installed gpulab ({Path(shadow.__file__).parents[1]})" in proc.stderr
    assert "Fix: rename or move that folder" in proc.stderr


def test_without_the_folder_the_installed_package_is_imported(tmp_path: Path) -> None:
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "imported gpulab"


def test_the_guard_steps_aside_for_anything_but_a_namespace_gpulab(tmp_path: Path, monkeypatch) -> None:
    guard = shadow.ShadowGuard()
    # sys.path as a student's script sees it: pytest's rootdir (this checkout, with its gpulab/) is on
    # sys.path here, and a regular package anywhere on the path wins over a namespace folder
    outside = [p for p in sys.path if not (Path(p or ".") / "gpulab" / "__init__.py").is_file()]
    monkeypatch.setattr(sys, "path", [str(tmp_path), *outside])
    assert guard.find_spec("gpulab") is None            # nothing named gpulab on sys.path: the installed one
    assert guard.find_spec("numpy") is None             # other names: never its business
    (tmp_path / "gpulab").mkdir()
    with pytest.raises(ImportError, match="found the folder .*gpulab, which is not the gpulab package"):
        guard.find_spec("gpulab")
    assert guard.find_spec("gpulab.grading", path=[str(tmp_path / "gpulab")]) is None   # submodules: the usual rules
    (tmp_path / "gpulab" / "__init__.py").write_text("")
    assert guard.find_spec("gpulab") is None            # a real package there is the user's choice
