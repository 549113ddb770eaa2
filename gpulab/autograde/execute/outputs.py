"""What the grader writes into a graded notebook's cells, and what it reads back from them.

The names of the errors it writes (:data:`KERNEL_DIED`, :data:`NOT_RUN`, :data:`TIMEOUT`,
:data:`VERDICT`) and the marker of a capped cell are read by :mod:`gpulab.autograde.notes`; the
verdict's outputs are what nbgrader scores (:func:`write_verdict`).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from nbformat.notebooknode import NotebookNode

KERNEL_DIED = "DeadKernelError"
NOT_RUN = "NotRunError"
TIMEOUT = "CellTimeoutError"
VERDICT = "GradingError"
OUTPUT_CAPPED = "[gpulab grader: output past the cap was dropped:"
# Opens the line of clean_log that says the kernel filled its folder (gpulab.autograde.collect reads it).
FULL = "[full]"
MAX_RECORDS = 5000               # evidence records per cell
MAX_EVIDENCE_BYTES = 256 * 2**20  # evidence per cell


def timeout_error(limit: int | None) -> dict[str, Any]:
    """The error a cell stopped by the limit shows (nbclient's ``error_on_timeout``)."""
    text = (f"this cell ran past the course's limit of {limit} s per cell and was interrupted; the cells after "
            "it ran without what it would have defined")
    return {"ename": TIMEOUT, "evalue": text, "traceback": [f"{TIMEOUT}: {text}"]}


def after_timeout(index: int, limit: int | None) -> str:
    """What a failing test adds when an earlier cell was stopped by the limit."""
    return f"(cell {index} above ran past the {limit} s limit per cell and was stopped: that may be why)"


def error_output(ename: str, evalue: str) -> NotebookNode:
    """An nbformat error output, which nbgrader scores as a failed cell."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def size(content: Any) -> int:
    """About how many bytes a message's content holds (its strings), without serialising it."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, dict):
        return sum(size(v) for v in content.values())
    if isinstance(content, (list, tuple)):
        return sum(size(v) for v in content)
    return 8


def is_test(cell: NotebookNode) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def is_timeout(cell: NotebookNode) -> bool:
    return any(o.get("output_type") == "error" and o.get("ename") == TIMEOUT for o in cell.get("outputs", []))


def write_verdict(cell: NotebookNode, passed: bool, message: str, figures: list[str], note: str = "") -> None:
    """The cell's outputs as nbgrader must score them: the verdict, then what the cell printed; what a
    human should look at goes in the cell's metadata (gpulab.autograde.notes reads it)."""
    if note:
        cell.metadata.setdefault("gpulab", {})["note"] = note
    kept = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "error" and out.get("ename") in (NOT_RUN, KERNEL_DIED, TIMEOUT) and not passed:
            kept.append(out)
        elif kind == "error":
            continue  # the kernel's own report; the verdict below says what failed
        elif kind == "execute_result":  # a value shown by a test cell is not a score
            out["output_type"] = "display_data"
            out.pop("execution_count", None)
            kept.append(out)
        elif kind == "stream" and out.get("name") == "stderr" and passed:
            out["name"] = "stdout"  # nbgrader scores any stderr 0; the verdict is the grader's
            kept.append(out)
        else:
            kept.append(out)
    if figures:  # the grader's own outputs are marked: the feedback shows them (gpulab.course.feedback)
        kept.append(NotebookNode(output_type="display_data", metadata={"gpulab": "verdict"},
                                 data={"text/plain": "".join(f"{f}\n" for f in figures)}))
    if not passed:
        kept.insert(0, error_output(VERDICT, message or "failed"))
    cell.outputs = kept


class OutputCap:
    """Output kept per cell up to ``cap_bytes``; past it, outputs are dropped and the cell says so."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap = cap_bytes
        self.kept: dict[int, int] = {}
        self.dropped: dict[int, int] = {}

    def admit(self, index: int, n: int, always: bool = False) -> bool:
        if always or self.kept.get(index, 0) + n <= self.cap:
            self.kept[index] = self.kept.get(index, 0) + n
            return True
        self.dropped[index] = self.dropped.get(index, 0) + n
        return False

    def mark(self, outs: list[NotebookNode], index: int) -> None:
        """The stderr line that says how much of this cell's output was dropped."""
        marker = next((o for o in reversed(outs) if o.get("output_type") == "stream" and o.get("name") == "stderr"
                       and o.get("text", "").startswith(OUTPUT_CAPPED)), None)
        if marker is None:
            marker = NotebookNode(output_type="stream", name="stderr", text="")
            outs.append(marker)
        marker["text"] = f"{OUTPUT_CAPPED} {self.dropped[index] / 2**20:.1f} MiB past {self.cap // 1024} KiB]\n"


def make_room(folder: str, keep: set[str]) -> list[str]:
    """When the kernel filled its folder (a disk of its own, ``nsinit --quota``), remove what it
    created there so that nbgrader can still save the graded notebook; returns what was removed."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return []
    full = st.f_bavail < 0.05 * st.f_blocks or (st.f_files and st.f_favail < 0.05 * st.f_files)
    if not full:
        return []
    removed = []
    for name in sorted(set(os.listdir(folder)) - keep)[:100_000]:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                continue
        removed.append(name)
    return removed
