"""gpulab.autograde.notes: the notes a student reads name the cell and the limit it hit."""

from __future__ import annotations

from pathlib import Path

import nbformat

from gpulab.autograde import notes
from gpulab.autograde.execute.preprocessor import KERNEL_DIED, NOT_RUN, OUTPUT_CAPPED, TIMEOUT, error_output


def test_notes_name_the_cell_and_the_limit(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    for i, (gid, out) in enumerate([("loop_impl", error_output(TIMEOUT, "")),
                                    ("hog_impl", error_output("MemoryError", "")),
                                    ("exit_impl", error_output(KERNEL_DIED, "")),
                                    ("t1", error_output(NOT_RUN, "")), ("t2", error_output(NOT_RUN, ""))]):
        cell = nbformat.v4.new_code_cell("x", outputs=[out])
        cell.metadata["nbgrader"] = {"grade_id": gid}
        nb.cells.append(cell)
    nbformat.write(nb, str(tmp_path / "lab.ipynb"))
    got = notes.output_notes(tmp_path / "lab.ipynb", 20, 1024)
    assert got == ["cell 0 (loop_impl) stopped at the 20 s cell time limit",
                   "cell 1 (hog_impl) ran out of memory (limit 1024 MiB)",
                   "the kernel died in cell 2 (exit_impl) (os._exit, a signal, or a crash)",
                   "2 later cell(s) of lab.ipynb were not run"]
    log = tmp_path / "nbgrader.log"
    log.write_text("[AutogradeApp | ERROR] boom\n    ValueError: the real reason\n[AutogradeApp | ERROR] There was an error processing x\n")
    assert notes.last_error(log) == "ValueError: the real reason"


def test_a_capped_output_is_noted(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(...)", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="x" * 10),
        nbformat.v4.new_output("stream", name="stderr", text=f"{OUTPUT_CAPPED} 199.0 MiB past 1024 KiB]\n")])
    cell.metadata["nbgrader"] = {"grade_id": "flood_impl"}
    nb.cells.append(cell)
    nbformat.write(nb, str(tmp_path / "lab.ipynb"))
    assert notes.output_notes(tmp_path / "lab.ipynb", 20, 1024) == [
        "cell 0 (flood_impl) printed too much output; dropped 199.0 MiB past 1024 KiB"]
