"""gpulab.grading.labNN: every lab's grader module exposes a public REFERENCES tuple of gpulab's
library code (never a grader), and every entry can be masked: the masked copy of its module
imports, keeps the module's other names working, and the entry raises ``MaskedReference``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys

import pytest

import gpulab
from gpulab import grading
from gpulab.autograde.box import mask
from gpulab.grading import exercises  # noqa: F401 - grading.exercises below

# every labNN module in gpulab/grading, so a new lab's graders are checked without editing this file
LAB_MODULES = sorted(f"gpulab.grading.{m.name}" for m in pkgutil.iter_modules(grading.__path__)
                     if re.fullmatch(r"lab\d\d", m.name))


def test_every_lab_has_a_grader_module() -> None:
    assert LAB_MODULES[:9] == [f"gpulab.grading.lab{n:02d}" for n in range(9)]


@pytest.mark.parametrize("name", LAB_MODULES)
def test_each_lab_exposes_maskable_references(name: str, tmp_path) -> None:
    module = importlib.import_module(name)
    refs = module.REFERENCES
    assert "REFERENCES" in module.__all__ and isinstance(refs, tuple) and refs, f"{name}.REFERENCES"
    assert len(set(map(id, refs))) == len(refs), f"{name}.REFERENCES lists an entry twice"
    homes = {inspect.getmodule(r).__name__ for r in refs}
    assert all(h.startswith("gpulab.") and not h.startswith(("gpulab.grading", "gpulab.course")) for h in homes), homes
    binds = mask.write_masks(refs, tmp_path)  # raises MaskError for anything but module-level functions and classes
    for copy, original in binds:
        if original.suffix != ".py":
            continue
        # the masked copy imports on its own, and every masked entry raises MaskedReference
        modname = next(inspect.getmodule(r).__name__ for r in refs if inspect.getsourcefile(r) == str(original))
        spec = importlib.util.spec_from_file_location(f"_masked_{modname.replace('.', '_')}", copy)
        masked_module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = masked_module
        try:
            spec.loader.exec_module(masked_module)
        finally:
            sys.modules.pop(spec.name, None)
        for ref in refs:
            if inspect.getsourcefile(ref) != str(original):
                continue
            stub = getattr(masked_module, ref.__name__)
            code = stub.__init__ if inspect.isclass(stub) else stub
            assert grading.exercises.masked(stub), f"{ref.__name__} is not masked in the copy of {modname}"
            params = [p for p in inspect.signature(code).parameters.values()
                      if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            args = [None] * (len(params) - (1 if inspect.isclass(stub) else 0))
            kwargs = {p.name: None for p in inspect.signature(code).parameters.values()  # required keyword-only ones
                      if p.default is p.empty and p.kind is p.KEYWORD_ONLY}
            with pytest.raises(gpulab.MaskedReference):
                stub(*args, **kwargs)
