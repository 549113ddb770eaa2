"""gpulab.autograde.execute.config: the sandbox's executor replaces nbgrader's Execute and nothing else,
and the box's settings are data nbgrader reads (no config written as code)."""

from __future__ import annotations

import json

import pytest

from gpulab.autograde.execute.config import EXECUTE, autograde_preprocessors, write_box_config


def test_the_sandboxes_executor_replaces_only_nbgraders_execute() -> None:
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute

    default = Autograde.class_traits()["autograde_preprocessors"].default()
    swapped = autograde_preprocessors()
    assert len(swapped) == len(default) and swapped.count(EXECUTE) == 1
    assert [p for p in swapped if p != EXECUTE] == [f"{p.__module__}.{p.__qualname__}" for p in default if p is not Execute]
    with pytest.raises(ValueError, match="Execute"):
        autograde_preprocessors([])


def test_the_box_settings_load_over_the_courses_config(tmp_path) -> None:
    """nbgrader reads nbgrader_config.json after nbgrader_config.py in the same folder: the box's
    settings win over the course's, and the executor named as a string is importable."""
    from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.Execute.timeout = 5\nc.CourseDirectory.root = 'x'\n")
    write_box_config(tmp_path, {"CourseDirectory": {"root": str(tmp_path)}, "Autograde": {
        "autograde_preprocessors": autograde_preprocessors()}})
    config = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    config.merge(JSONFileConfigLoader("nbgrader_config.json", path=str(tmp_path)).load_config())
    assert config.CourseDirectory.root == str(tmp_path) and config.Execute.timeout == 5
    assert json.loads((tmp_path / "nbgrader_config.json").read_text())["Autograde"]["autograde_preprocessors"]
    from traitlets.utils.importstring import import_item

    assert import_item(EXECUTE).__name__ == "GpulabExecute"
