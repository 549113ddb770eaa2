"""``make check``'s verdict on one notebook: nbgrader's own validation result, with the configuration
of the Validate button in ``make lab``'s JupyterLab (:mod:`gpulab.autograde.execute.config`'s limits).

``nbgrader validate`` prints for a person and exits 0 either way, and its log can hold words such
as ``ValueError`` on a notebook that passes. So nbgrader's ``Validator`` runs as the button runs it
(the notebook's folder, then Jupyter's config path), in a child process (it runs a kernel, and
nbgrader's configuration is global state), which prints its result as one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.autograde.execute.config import write_nbgrader_config
from gpulab.autograde.nbgrader import nbgrader_env

# what the child prints before its JSON line, so stray prints of the notebook cannot be mistaken for it
_MARK = "gpulab-validate-result: "


@dataclass
class Validation:
    """nbgrader's result for one notebook: ``(first line, error)`` of each failed test cell, the first
    lines of edited test cells and of cells whose type changed, or why no result came back."""

    notebook: Path
    failed: list[tuple[str, str]] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    type_changed: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        """True when nbgrader found nothing wrong: what the Validate button calls Success."""
        return not (self.failed or self.changed or self.type_changed or self.error)

    def summary(self) -> str:
        """A few lines a student can act on; empty when the notebook passes."""
        lines = []
        if self.error:
            lines.append(f"nbgrader could not validate it: {self.error}")
        for first in self.type_changed:
            lines.append(f"a cell's type was changed (code <-> markdown), change it back: {first}")
        for first in self.changed:
            lines.append(f"a test cell was edited, restore it (the grader uses the original): {first}")
        for first, err in self.failed:
            if first == "YOUR ANSWER HERE" and "did not provide a response" in err:  # nbgrader's markdown answer
                lines.append("a written answer is still 'YOUR ANSWER HERE': write it (the instructor grades it)")
                continue
            last = err.strip().splitlines()[-1] if err.strip() else "(no output)"
            lines.append(f"test failed: {first}\n  {last}")
        return "\n".join(lines)


def _first_line(source: str) -> str:
    return (source.strip().splitlines() or [""])[0][:100]


def validate(notebook: str | Path, timeout: float | None = 1800) -> Validation:
    """Validate one notebook with nbgrader in a child process, within ``timeout`` seconds (``error`` is
    set, not raised, when no result came back)."""
    notebook = Path(notebook).resolve()
    result = Validation(notebook)
    # the execution limits of the student's JupyterLab (which make lab writes the same way)
    config = write_nbgrader_config(Path(sys.prefix) / "etc" / "gpulab-lab" / "validate").parent
    env = nbgrader_env()
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join([str(config), *filter(None, [env.get("JUPYTER_CONFIG_PATH")])])
    try:
        proc = subprocess.run([sys.executable, "-m", "gpulab.course.validate", str(notebook)], cwd=str(notebook.parent),
                              env=env, text=True, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        result.error = f"it ran for more than {timeout:g} s; look for a cell that never ends"
        return result
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        result.error = "\n".join(tail) or f"exit status {proc.returncode}"
        return result
    raw = json.loads(lines[-1][len(_MARK):])
    result.failed = [(_first_line(c["source"]), c.get("raw_error", "")) for c in raw.get("failed", [])]
    result.changed = [_first_line(c["source"]) for c in raw.get("changed", [])]
    result.type_changed = [_first_line(c["source"]) for c in raw.get("type_changed", [])]
    return result


def _child(path: str) -> int:
    # The configuration search of nbgrader's Validate button (server_extensions/validate_assignment).
    from nbgrader.apps import NbGrader
    from nbgrader.validator import Validator

    app = NbGrader()
    app.load_config_file()  # the current folder (the notebook's), then Jupyter's config path
    raw = Validator(config=app.config).validate(path)
    print(_MARK + json.dumps(raw), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m gpulab.course.validate NOTEBOOK")
    sys.exit(_child(sys.argv[1]))
