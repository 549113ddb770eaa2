"""Run the nbgrader command line from Python, with the environment it needs.

nbgrader starts ``alembic`` (database migrations) and ``jupyter`` through PATH, so the folder of
the running interpreter goes first on PATH; without it ``generate_assignment`` fails with
``FileNotFoundError: 'alembic'`` when the venv is not activated.
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
    """nbgrader's command line in this interpreter's environment, started through
    :mod:`gpulab.course.nbgrader_main` (the same program, a second or two faster to start)."""
    return [sys.executable, "-m", "gpulab.course.nbgrader_main"]


def nbgrader(course: str | Path, *args: str, timeout: float | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``nbgrader *args`` in the course root and return the finished process (never raises on
    a non-zero exit: callers decide what a failure means)."""
    return subprocess.run(nbgrader_command() + list(args), cwd=str(course), env=nbgrader_env(env), text=True,
                          capture_output=True, timeout=timeout)


def find_labs(course: str | Path) -> list[str]:
    """Lab folders under ``<course>/source`` that hold at least one notebook, sorted."""
    source = Path(course) / "source"
    if not source.is_dir():
        raise FileNotFoundError(f"no {source}: run this from the repository, or pass --course notebooks")
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
