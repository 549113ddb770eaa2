"""The course's execution limits, in one place, for every way a notebook is run: the Validate button,
``make check`` and ``make grade``. Each reads an ``nbgrader_config.py`` that calls :func:`configure`
(the course's; the student's, :func:`write_nbgrader_config` copies it from
``gpulab/autograde/execute/student_config.py``), so a cell has the same :data:`CELL_TIMEOUT_S`
everywhere (nbgrader's default, 30 s, cut lab 10 short in Validate). A cell stopped by the limit
says so, and every test that fails after it names that cell (:class:`GpulabExecute` in its
``validate`` mode replaces nbgrader's ``Execute`` in the Validator).

The grading sandbox's own settings are data: :func:`write_box_config` writes them as nbgrader's
``nbgrader_config.json`` beside the course's ``nbgrader_config.py``, and nbgrader reads both.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from gpulab.autograde.execute.outputs import timeout_error

CELL_TIMEOUT_S = 300  # every lab runs in about 2 minutes on a 2-core laptop: a cell of 5 minutes is a loop
EXECUTE = "gpulab.autograde.execute.preprocessor.GpulabExecute"
STUDENT_CONFIG = Path(__file__).with_name("student_config.py")


def configure(c: Any) -> None:
    """Set the course's execution limits on a traitlets config ``c`` (an ``nbgrader_config.py``)."""
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput
    from nbgrader.validator import Validator

    from gpulab.autograde.execute.preprocessor import GpulabExecute

    c.Execute.timeout = CELL_TIMEOUT_S
    c.Execute.interrupt_on_timeout = True
    c.Execute.error_on_timeout = timeout_error(CELL_TIMEOUT_S)
    # Validate (the button and `make check`) runs nbgrader's Execute; this one names a cell stopped by the limit
    Validator.preprocessors = [CheckCellMetadata, ClearOutput, GpulabExecute]


def write_nbgrader_config(folder: str | Path) -> Path:
    """Put the student's ``nbgrader_config.py`` (which calls :func:`configure`) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nbgrader_config.py"
    shutil.copyfile(STUDENT_CONFIG, path)
    return path


def autograde_preprocessors(steps: list[Any] | None = None) -> list[str]:
    """nbgrader's autograde steps (or the course's own ``steps``: classes or dotted names), its
    ``Execute`` replaced by :class:`GpulabExecute` (dotted names)."""
    from nbgrader.converters.autograde import Autograde

    if steps is None:
        steps = Autograde.class_traits()["autograde_preprocessors"].default()
    names = [p if isinstance(p, str) else f"{p.__module__}.{p.__qualname__}" for p in steps]
    plain = {"nbgrader.preprocessors.execute.Execute", "nbgrader.preprocessors.Execute"}
    if not plain & set(names):
        raise ValueError("c.Autograde.autograde_preprocessors has no nbgrader Execute step to sandbox; "
                         "keep nbgrader.preprocessors.Execute in the list")
    return [EXECUTE if n in plain else n for n in names]


def write_box_config(box: Path, settings: dict[str, dict[str, Any]]) -> Path:
    """The sandbox's settings as nbgrader's ``nbgrader_config.json`` in ``box`` (read after the
    ``nbgrader_config.py`` there, whose settings it overrides)."""
    path = box / "nbgrader_config.json"
    path.write_text(json.dumps(settings, indent=1, sort_keys=True))
    return path
