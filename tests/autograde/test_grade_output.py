"""``make grade``'s output and ``grades.csv``, byte for byte, for a fixed class and seed (issue 49: the
grader's restructuring changes neither).

The class is the probe lab of ``test_measured_grading`` with submissions that reach the grader's
other paths: a wrong value, a serial loop (the measured rule), an edited test cell, a kernel that
dies, a write outside its folder. The golden files were written by the grader before its stages were
cut apart (``GOLDEN=1`` rewrites them: only for a change of behaviour, said in the commit).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

from autograde.test_measured_grading import CLASS, _course

pytestmark = [pytest.mark.notebook]
GOLDEN = REPO / "tests" / "data" / "grade-output"
SEED = 424242
STUDENTS = {
    "honest": CLASS["honest"],
    "serial": CLASS["serial"],
    "wrong_sum": CLASS["wrong_sum"],
    "dies": ("import os\ndef fast_sum(n, seed):\n    os._exit(3)\n", None, 0, None),
    "writes_out": ("open('/var/tmp/gpulab-probe-escape.txt', 'w').write('x')\n" + CLASS["honest"][0] if CLASS["honest"][0]
                   else "open('/var/tmp/gpulab-probe-escape.txt', 'w').write('x')\n"
                        "def fast_sum(n, seed):\n    g = torch.Generator().manual_seed(seed)\n"
                        "    return float(torch.rand(n, generator=g, dtype=torch.float64).sum())\n", None, 4, None),
}


def _stable(text: str) -> str:
    """What does not depend on the machine: no seconds, no temporary paths, no progress bar."""
    keep = []
    for line in text.splitlines():
        if line.startswith(("reference run of", "slowest:", "grading with", "protections:", "  on ", "  OFF ",
                            "verdicts:", "  by construction", "  only detected", "  left to you", "wrote ")):
            continue
        keep.append(re.sub(r" in \d+ s:", " in N s:", line))
    return "\n".join(keep) + "\n"


@pytest.mark.timeout(900)
def test_make_grade_prints_and_writes_what_it_did(tmp_path) -> None:
    root = _course(tmp_path, STUDENTS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "gpulab.autograde", "--course", str(root), "--jobs", "2",
                           "--seed", str(SEED), "--cell-timeout", "60", "--wall-timeout", "300", "--memory-mb", "1536",
                           "--quiet", "--allow-weaker-sandbox"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {"stdout.txt": _stable(proc.stdout), "grades.csv": (root / "grades.csv").read_text()}
    if os.environ.get("GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in got.items():
            (GOLDEN / name).write_text(text)
    for name, text in got.items():
        assert text == (GOLDEN / name).read_text(), f"{name} changed:\n{text}"
