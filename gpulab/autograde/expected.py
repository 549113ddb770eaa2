"""One lab's reference run, as the grader keeps it: ``expected.json``, readable by the grader only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab.evidence.records import VERSION
from gpulab.verdict.cell import self_check


@dataclass
class Expected:
    """One lab's reference run (``expected.json``, readable by the grader only): for each notebook
    and test cell, the entries its checks sent."""

    lab: str
    seed: int
    cpus: int
    cells: dict[str, dict[str, dict[str, Any]]]   # notebook -> grade_id -> {"entries": [...], "error": str}
    seconds: float = 0.0

    def cell(self, notebook: str, grade_id: str) -> dict[str, Any] | None:
        return self.cells.get(notebook, {}).get(grade_id)

    def save(self, path: Path) -> None:
        data = {"version": VERSION, "lab": self.lab, "seed": self.seed, "cpus": self.cpus, "seconds": self.seconds,
                "cells": self.cells}
        path.write_text(json.dumps(data))
        path.chmod(0o600)

    @classmethod
    def load(cls, path: Path) -> "Expected":
        data = json.loads(Path(path).read_text())
        if data.get("version") != VERSION:
            raise ValueError(f"{path} is not a reference run of this gpulab (version {data.get('version')})")
        return cls(data["lab"], int(data["seed"]), int(data["cpus"]), data["cells"], float(data.get("seconds", 0)))

    def problems(self) -> list[str]:
        """Where the reference run fails its own checks: the source notebook has a bug, and no
        submission of this lab can be graded against it."""
        return [f"{nb}/{gid}: {why}" for nb, cells in self.cells.items() for gid, cell in cells.items()
                if (why := self_check(cell))]
