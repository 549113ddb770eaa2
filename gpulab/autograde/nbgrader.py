"""Run nbgrader's command line from Python, with the environment it needs.

nbgrader starts ``alembic`` and ``jupyter`` through PATH, so this interpreter's folder goes first
on PATH (else ``generate_assignment`` fails with ``FileNotFoundError: 'alembic'`` outside the venv).

``python -m gpulab.autograde.nbgrader autograde ...`` is the ``nbgrader`` script but for one
import. jsonschema (through nbformat) compiles an Earley grammar with lark for the optional
``iri`` format checker of ``rfc3987-syntax``: 1 to 2 s of every nbgrader start on a 2-core
machine, and grading starts one nbgrader per submission. No schema of nbformat, nbgrader or
jupyter_server uses that format; with the module blocked, jsonschema skips the checker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def nbgrader_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` with this interpreter's bin folder first on PATH."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def nbgrader_command() -> list[str]:
    """nbgrader's command line in this interpreter's environment (this module, a faster start)."""
    return [sys.executable, "-m", "gpulab.autograde.nbgrader"]


def nbgrader(course: str | Path, *args: str, timeout: float | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``nbgrader *args`` in the course root (a non-zero exit is the caller's to judge)."""
    return subprocess.run(nbgrader_command() + list(args), cwd=str(course), env=nbgrader_env(env), text=True,
                          capture_output=True, timeout=timeout)


def find_labs(course: str | Path) -> list[str]:
    """Lab folders under ``<course>/source`` that hold at least one notebook, sorted."""
    source = Path(course) / "source"
    if not source.is_dir():
        raise FileNotFoundError(f"no {source}: run this from the repository, or pass --course notebooks")
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def main() -> None:
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[assignment] - None makes the import fail
    from nbgrader.apps.nbgraderapp import main as nbgrader_main

    sys.argv[0] = "nbgrader"
    nbgrader_main()


if __name__ == "__main__":
    main()
