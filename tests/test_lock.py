"""requirements.lock against pyproject.toml and constraints.txt: every dependency is locked, at a version
its range admits, with hashes; what `make setup` installs is what `make lock` resolved."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {"torch"}  # from TORCH_INDEX, not the lock (its files and hashes differ by index)
ENV = {"python_full_version": "3.11.7", "python_version": "3.11", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def _lock() -> dict[str, list[tuple[str, str | None, int]]]:
    """name -> [(version, marker, number of hashes)] for every entry of requirements.lock."""
    entries: dict[str, list[tuple[str, str | None, int]]] = {}
    text = (ROOT / "requirements.lock").read_text()
    for block in re.split(r"\n(?=[a-z0-9])", text):
        head = block.split("\n", 1)[0]
        m = re.match(r"([A-Za-z0-9_.\-]+)==([^ ;\\]+)\s*(?:;\s*([^\\]+))?", head)
        if m:
            name, version, marker = m.group(1), m.group(2), (m.group(3) or "").strip() or None
            entries.setdefault(canonicalize_name(name), []).append((version, marker, block.count("--hash=sha256:")))
    return entries


def _for_this_python(lock: dict, name: str) -> str | None:
    for version, marker, _ in lock.get(name, []):
        if marker is None or Marker(marker).evaluate(ENV):
            return version
    return None


def test_every_dependency_and_extra_is_locked_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    lock = _lock()
    assert len(lock) > 50, "requirements.lock looks empty: run make lock"
    for line in reqs:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name in SKIPPED:
            continue
        version = _for_this_python(lock, name)
        assert version is not None, f"{req.name} is in pyproject.toml but not in requirements.lock: run make lock"
        assert req.specifier.contains(version, prereleases=True), \
            f"requirements.lock has {req.name}=={version}, outside pyproject's {req.specifier}: run make lock"


def test_constraints_are_the_locked_versions_and_every_entry_has_hashes() -> None:
    lock = _lock()
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name in SKIPPED:
            assert name not in lock, "torch must not be in the lock: it comes from TORCH_INDEX"
            continue
        assert _for_this_python(lock, name) == str(next(iter(req.specifier)).version), \
            f"constraints.txt pins {line}, requirements.lock does not: run make lock"
    unhashed = [name for name, entries in lock.items() for _, _, hashes in entries if hashes == 0]
    assert not unhashed, f"entries without a hash (pip --require-hashes refuses them): {unhashed}"
    cuda = [name for name in lock if name.startswith(("nvidia-cu", "nvidia-nccl", "triton", "cuda-"))]
    assert not cuda, f"CUDA-only wheels belong to TORCH_INDEX, not the lock: {cuda}"
