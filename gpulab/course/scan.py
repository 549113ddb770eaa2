"""A static scan of a submission for code that only tampering needs: a note for a human, never a score.

No lab asks a student to touch IPython's machinery, the profiler, ``builtins``, ``sys.modules``,
gpulab's or torch's module attributes, a kernel client, symbolic links, terminal ioctls or the
frames of its callers; each was used in a red-team of ``make grade``. None of them can change a
verdict any more (the grader decides from evidence, outside the kernel), but a submission that
tries is worth a human's look, and some of them (patching gpulab's instruments) change what an
instrument measures in the kernel. The scan reads the cells a student may edit (not the locked
cells the gradebook restores) and names what it finds.
"""

from __future__ import annotations

import re

from nbformat.notebooknode import NotebookNode

# name -> pattern; each is something the red-team used and no lab needs.
PATTERNS: dict[str, re.Pattern[str]] = {name: re.compile(rx) for name, rx in {
    "IPython events": r"get_ipython\(\)\s*\.\s*events|\bevents\s*\.\s*(register|unregister|callbacks|trigger)\b",
    "input transformers": r"input_transformer|ast_transformers",
    "displayhook": r"displayhook",
    "showtraceback": r"showtraceback",
    "ExecutionResult": r"ExecutionResult",
    "setprofile/settrace": r"\bset(profile|trace)(_all_threads)?\b",
    "writes to builtins": r"\b__builtins__\b|\bbuiltins\s*\.\s*\w+\s*=(?!=)|setattr\(\s*builtins\b",
    "writes to sys.modules": r"sys\s*\.\s*modules\s*(\[[^\]]*\]\s*=(?!=)|\.\s*(update|pop|setdefault|clear)\b)"
                             r"|del\s+sys\s*\.\s*modules",
    "attribute assignment on gpulab/torch modules": r"(?m)^\s*(gpulab|grading|torch(?!\.backends))(\s*\.\s*\w+)+"
                                                   r"\s*=(?!=)|setattr\(\s*(gpulab|grading|torch)\b",
    "jupyter_client": r"jupyter_client",
    "os.symlink": r"\bsymlink(_to)?\b|\bhardlink_to\b|\bos\s*\.\s*link\b|\bln\s+-s\b",
    "ioctl": r"\bioctl\b|TIOCSTI",
    "the callers' frames (the tests' source)": r"\bf_back\b|sys\s*\.\s*_getframe|\blinecache\b|"
                                               r"inspect\s*\.\s*(stack|currentframe|getouterframes|getsource)",
}.items()}


def scan_source(source: str) -> list[str]:
    """The names of the patterns ``source`` matches, in :data:`PATTERNS` order."""
    return [name for name, rx in PATTERNS.items() if rx.search(source)]


def scan_cell(cell: NotebookNode) -> list[str]:
    """:func:`scan_source` of a code cell the student may edit (locked cells are the course's)."""
    if cell.get("cell_type") != "code" or cell.get("metadata", {}).get("nbgrader", {}).get("locked"):
        return []
    return scan_source(cell.get("source", ""))


def scan_notes(nb: NotebookNode) -> list[str]:
    """One note per flagged cell: ``cell 7 (to_device_impl) uses displayhook, ExecutionResult ...``."""
    notes = []
    for i, cell in enumerate(nb.cells):
        found = scan_cell(cell)
        if found:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            label = f"cell {i} ({gid})" if gid else f"cell {i}"
            notes.append(f"{label} uses {', '.join(found)}, which only tampering needs; a human should review it")
    return notes
