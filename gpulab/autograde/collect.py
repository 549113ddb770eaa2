"""What one submission's sandboxed run left: planted files, stray writes, the jail's log, the
notebooks' notes, and the scores nbgrader saved in the box's gradebook."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpulab.autograde import notes as notes_mod
from gpulab.autograde.box import integrity, links
from gpulab.autograde.execute.outputs import FULL
from gpulab.autograde.limits import Limits, SandboxResult

_NBGRADER_FILES = {"gradebook.db", "gradebook.db-journal", "gradebook.db-wal", "gradebook.db-shm",
                   ".nbgrader.log", "nbgrader.log", "writes.jsonl", "nbgrader_config.py", "removed.txt",
                   "namespace.json"}


def snapshot(root: Path, skip: list[Path]) -> dict[str, tuple[int, int]]:
    """Size and mtime of every file under ``root`` except those under ``skip``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        for name in filenames:
            p = d / name
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _apparent_bytes(folders: list[Path], skip: set[str]) -> int:
    """The size of every regular file under ``folders`` (links not followed), but those named in ``skip``."""
    total = 0
    for folder in folders:
        for dirpath, _, filenames in os.walk(folder):
            for name in filenames:
                if name in skip:
                    continue
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def read_scores(result: SandboxResult, db_url: str, student: str | None = None) -> None:
    """Copy the auto scores, comments, penalties and timestamp nbgrader saved into ``result``
    (``student``: the name it was graded under, when that is an alias)."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url, course_id="") as gb:
        sub = gb.find_submission(result.lab, student or result.student)
        result.timestamp = sub.timestamp
        for nb in sub.notebooks:
            result.late_penalties[nb.name] = nb.late_submission_penalty
            for g in nb.grades:
                result.grades[(nb.name, g.name)] = g.auto_score
            for c in nb.comments:
                result.comments[(nb.name, c.name)] = c.auto_comment


def collect(result: SandboxResult, box: Path, student: str, lab: str, specs: dict[str, integrity.NotebookSpec],
             limits: Limits, rc: int | None, timed_out: bool, before: dict[str, tuple[int, int]]) -> SandboxResult:
    """Read what the run left: planted files, stray writes, the jail's log, the notebooks' notes, the scores."""
    work = box / "autograded" / student / lab
    planted = links.remove_unsafe(box)  # the kernel's processes are gone: nothing re-plants them now
    if (box / "removed.txt").is_file():  # what nbgrader's SandboxedExecute removed when the kernel stopped
        lines = (box / "removed.txt").read_text().split("\n")[:-1]
        for line in (ln for ln in lines if ln.startswith(FULL)):
            result.notes.append(f"filled its folder (a disk of its own, {limits.disk_mb} MiB and {limits.files_max} "
                                f"files): removed {line[len(FULL):].strip()} so that its notebook could be saved")
        planted = [ln for ln in lines if not ln.startswith(FULL)] + planted
    planted = [p for p in planted if not p.startswith("tmp/")]  # sockets of DataLoader workers, harmless there
    if planted:
        result.notes.append(f"left links or special files in its folder, removed unread: {notes_mod.some(planted)}")
    left = _apparent_bytes([work, box / "tmp"], skip={f"{name}.ipynb" for name in specs})
    if left > limits.max_notebook_mb * 2**20:  # sparse files count at their full size: that is what a copy costs
        result.notes.append(f"left {left / 2**20:.0f} MiB of files in its folders (apparent size); none is kept")
    after = snapshot(box, [work, box / "tmp"])
    strays = sorted(p for p, st in after.items() if before.get(p) != st and p not in _NBGRADER_FILES)
    result.landlock, refused, reads = notes_mod.read_write_log(box / "writes.jsonl")
    # the grading copy is deleted afterwards: name it, not its temporary path
    refused, reads = ([p.replace(str(box), "<grading copy>") for p in paths] for paths in (refused, reads))
    result.notes += notes_mod.write_notes(refused, strays, reads)
    if timed_out:
        result.status = "timeout"
        result.notes.append(f"ran past the {limits.wall_s:g} s wall-clock limit and was stopped; scored 0")
        return result
    # Other *.ipynb files a kernel left in its folder (empty, broken) would be read, merged into the
    # course and fed to nbgrader's feedback as if they were part of the lab: drop them here, once.
    for stray in work.glob("*.ipynb"):
        if stray.stem not in specs:
            stray.unlink()
    notebooks = sorted(work.glob("*.ipynb"))
    if result.landlock is None and notebooks:
        # The kernel never went through the jail (it logs its start first thing): do not trust this run.
        result.status = "failed"
        result.notes.append("grader error: the kernel ran without the sandbox (see nbgrader.log); scored 0, "
                            "regrade after fixing the course's nbgrader_config.py")
        return result
    if rc != 0 or not notebooks:
        result.status = "failed"
        reason = "cancelled" if rc is None else notes_mod.last_error(box / "nbgrader.log")
        result.notes.append(f"autograde failed: {reason}; scored 0")
        return result
    for nb in notebooks:
        result.notes += notes_mod.output_notes(nb, limits.cell_timeout_s, limits.memory_mb)
    read_scores(result, f"sqlite:///{box / 'gradebook.db'}", student)
    result.autograded = work
    return result


