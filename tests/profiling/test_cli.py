"""``python -m gpulab profile`` writes clean text when its output goes to a file (issue 16)."""

from __future__ import annotations

import subprocess
import sys


def test_no_progress_bar_when_stderr_is_not_a_terminal() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpulab", "profile", "--steps", "4", "--sample-ms", "0.1",
                           "--compute-ms", "1", "--device", "sim"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\r" not in proc.stderr and "it/s" not in proc.stderr, f"a tqdm bar went to a pipe: {proc.stderr[-500:]!r}"
    assert "busy" in proc.stdout.lower(), proc.stdout
