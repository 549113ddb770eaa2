"""Release the labs, hand students their copies (``make lab``, ``copy-work``), and validate their work
(``make check``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpulab.autograde.nbgrader import find_labs, nbgrader
from gpulab.course.validate import validate


def _labs_or(course: Path, lab: str | None) -> list[str]:
    labs = find_labs(course)
    if lab is None:
        return labs
    if lab not in labs:
        raise SystemExit(f"no lab {lab!r} in {course / 'source'}; the labs are: {', '.join(labs)}")
    return [lab]


def release(course: str | Path, lab: str | None = None) -> list[str]:
    """``nbgrader generate_assignment --force`` for each lab; returns the labs released (RuntimeError
    with nbgrader's output when one fails)."""
    course = Path(course).resolve()
    done = []
    for name in _labs_or(course, lab):
        proc = nbgrader(course, "generate_assignment", name, "--force")
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment {name} failed:\n{proc.stdout}\n{proc.stderr}")
        print(f"released {name} -> {course / 'release' / name}")
        done.append(name)
    return done


def copy_work(course: str | Path, work: str | Path) -> tuple[list[Path], list[Path]]:
    """Copy every released file into ``work/<lab>/`` only where it does not exist yet (a student's
    notebook is never replaced); returns (copied, kept)."""
    release_dir = Path(course) / "release"
    if not release_dir.is_dir():
        raise SystemExit(f"no {release_dir}: run `make release` first")
    copied, kept = [], []
    for src in sorted(release_dir.rglob("*")):
        if not src.is_file() or ".ipynb_checkpoints" in src.parts:
            continue
        dst = Path(work) / src.relative_to(release_dir)
        if dst.exists():
            kept.append(dst)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        copied.append(dst)
    print(f"work folder {Path(work).resolve()}: {len(copied)} new file(s) copied, {len(kept)} existing file(s) kept as they are")
    return copied, kept


def check_work(work: str | Path, lab: str | None = None) -> int:
    """``nbgrader validate`` every notebook in ``work/`` (or one lab); returns an exit status."""
    work = Path(work)
    pattern = f"{lab}/*.ipynb" if lab else "*/*.ipynb"
    notebooks = sorted(p for p in work.glob(pattern) if ".ipynb_checkpoints" not in p.parts)
    if not notebooks:
        print(f"no notebooks under {work}/{pattern}: run `make lab` first")
        return 1
    status = 0
    for nb in notebooks:
        # nbgrader's verdict, as the Validate button shows it (its warnings may say "ValueError")
        result = validate(nb)
        print(f"{'ok  ' if result.ok else 'FAIL'} {nb}")
        if not result.ok:
            print("     " + result.summary().replace("\n", "\n     "))
            status = 1
    return status
