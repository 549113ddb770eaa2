"""What the two real-browser tests share: the Chromium they drive, waiting on a condition, and how
to read nbgrader's Validate dialog (``browser_lab.py`` in one JupyterLab, ``browser_hub.py``
through JupyterHub). Not a test file: pytest collects only the ``browser_*.py`` files it is given.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
import warnings
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
# what Validate reports for a written answer left for later (nbgrader's markdown solution cell)
WRITTEN_PROMPT, NO_RESPONSE = "YOUR ANSWER HERE", "You did not provide a response."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(condition, timeout: float, what: str, every: float = 0.2):
    """Poll ``condition()`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def clear_dialogs(page, where: str) -> list[str]:
    """Answer any JupyterLab dialog over ``page``, so that a click meant for the notebook lands.

    "Select Kernel" is answered with its default (the notebook's own kernel). Any other dialog
    (a kernel that died and restarts, a lost server connection, a file changed on disk) is
    accepted with its default button and reported as a warning, which pytest prints even when the
    test passes: the test goes on to check what it checks, and CI's log says what the page asked.
    Returns the texts of the dialogs answered."""
    seen = []
    for _ in range(5):
        dialog = page.locator(".jp-Dialog").last
        if not dialog.count() or not dialog.is_visible():
            break
        text = " ".join(dialog.inner_text().split())
        seen.append(text)
        if "Select Kernel" not in text:
            warnings.warn(f"{where}: JupyterLab showed a dialog, accepted with its default: {text[:500]!r}",
                          stacklevel=2)
        accept = dialog.locator(".jp-Dialog-button.jp-mod-accept")
        try:
            (accept.last if accept.count() else dialog.get_by_role("button").last).click(timeout=5_000)
            dialog.wait_for(state="detached", timeout=5_000)
        except Exception:  # a dialog that closed on its own, or will not: Escape, look again
            page.keyboard.press("Escape")
    return seen


def written_answers(lab_id: str) -> int:
    """How many written answers (markdown solution cells, graded by hand) the lab asks for."""
    source = nbformat.read(str(REPO / "notebooks" / "source" / lab_id / f"{lab_id}.ipynb"), as_version=4)
    return sum(1 for c in source.cells if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution"))


def assert_validate_passed(text: str, lab_id: str, who: str = "") -> None:
    """Validate's dialog ``text`` says every test passed; the lab's written answers, which the
    student writes later and the instructor grades, are the only cells it may report."""
    said = f"{who}Validate said:\n{text[:2000]}"
    written = written_answers(lab_id)
    if not written:
        assert "Success" in text and "passes all the tests" in text, said
        return
    rest = text.replace(f"{WRITTEN_PROMPT}\n{NO_RESPONSE}", "")
    assert text.count(NO_RESPONSE) == written, f"only the {written} written answer(s) may be reported; {said}"
    assert not re.search(r"\w", re.sub(r"Validation Results|The following (\d+ )?cells? failed:|\bOk\b", "", rest)), \
        f"a test failed; {said}"


def solutions(lab_id: str) -> dict[str, str]:
    """The source notebook's solution code cells, by grade id, as a student types them (without
    nbgrader's markers)."""
    source = nbformat.read(str(REPO / "notebooks" / "source" / lab_id / f"{lab_id}.ipynb"), as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(
        line for line in c.source.splitlines() if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)
        for c in source.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}
