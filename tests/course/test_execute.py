"""gpulab.course.execute: the sandboxed executor replaces nbgrader's Execute and nothing else."""

from __future__ import annotations

import pytest

from gpulab.course.execute import swap_execute


def test_swap_execute_replaces_only_nbgraders_execute() -> None:
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute

    default = Autograde.class_traits()["autograde_preprocessors"].default()
    swapped = swap_execute()
    assert len(swapped) == len(default) and Execute not in swapped
    assert [p for p in swapped if p.__name__ != "SandboxedExecute"] == [p for p in default if p is not Execute]
    with pytest.raises(ValueError, match="Execute"):
        swap_execute([])
