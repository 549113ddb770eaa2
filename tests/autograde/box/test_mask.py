"""gpulab.autograde.box.mask: a reference's body is replaced by a raise, the rest of its module is kept."""

from __future__ import annotations

import pytest

from gpulab.autograde.box import mask

SOURCE = '''"""A module."""
import math


def helper(x):
    """Not masked."""
    return math.sqrt(x)


@staticmethod
def reference(x, y=2):
    """The recipe, step by step."""
    total = x + y
    return total


class Ref:
    """Its docstring."""

    size = 3

    def __init__(self, n):
        self.n = n

    def run(self):
        return self.n * 2


def one_liner(x): return x
'''


def test_masked_definitions_raise_and_the_rest_of_the_module_works() -> None:
    out = mask.mask_source(SOURCE, {"reference": "m.reference", "Ref": "m.Ref", "one_liner": "m.one_liner"})
    assert "The recipe" not in out and "Its docstring" not in out and "total = x + y" not in out
    assert "Not masked." in out and "size = 3" in out
    ns: dict = {}
    exec(compile(out, "m.py", "exec"), ns)
    assert ns["helper"](16) == 4.0
    import gpulab

    with pytest.raises(gpulab.MaskedReference, match="m.Ref.__init__"):
        ns["Ref"](3)
    with pytest.raises(gpulab.MaskedReference, match="m.one_liner"):
        ns["one_liner"](1)
    assert ns["Ref"].size == 3


def test_only_top_level_names_that_exist_can_be_masked() -> None:
    with pytest.raises(mask.MaskError, match="nowhere_to_be_found"):
        mask.mask_source(SOURCE, {"nowhere_to_be_found": "m.x"})

    class Local:
        def method(self):
            return 1

    with pytest.raises(mask.MaskError, match="module-level"):
        mask.write_masks([Local.method], __import__("pathlib").Path("/tmp"))


def test_write_masks_covers_the_compiled_copies(tmp_path) -> None:
    from gpulab.devices.batches import tree_map

    binds = mask.write_masks([tree_map], tmp_path)
    copy, original = binds[0]
    assert original.name == "batches.py" and "MaskedReference" in copy.read_text()
    assert all(src.read_bytes() == b"" for src, dst in binds[1:] if dst.suffix == ".pyc")
