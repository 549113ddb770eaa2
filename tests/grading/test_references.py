"""gpulab.grading.labNN: every lab's grader module exposes a public REFERENCES tuple for
``check_not_calling``, and every entry is gpulab's library code (what a submission must not call),
never a grader; check_not_calling really refuses a submission that calls one of them.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

from gpulab import grading
from gpulab.grading import GradingError

# every labNN module in gpulab/grading, so a new lab's graders are checked without editing this file
LAB_MODULES = sorted(f"gpulab.grading.{m.name}" for m in pkgutil.iter_modules(grading.__path__)
                     if re.fullmatch(r"lab\d\d", m.name))


def _home(obj) -> str:
    """The module an entry was defined in (a method's class counts as its home)."""
    return inspect.getmodule(obj).__name__


def test_every_lab_has_a_grader_module() -> None:
    assert LAB_MODULES[:9] == [f"gpulab.grading.lab{n:02d}" for n in range(9)]


@pytest.mark.parametrize("name", LAB_MODULES)
def test_each_lab_exposes_its_references(name: str) -> None:
    module = importlib.import_module(name)
    refs = module.REFERENCES
    assert "REFERENCES" in module.__all__ and isinstance(refs, tuple) and refs, f"{name}.REFERENCES"
    assert all(callable(r) for r in refs), [r for r in refs if not callable(r)]
    assert len(set(map(id, refs))) == len(refs), f"{name}.REFERENCES lists an entry twice"
    homes = {_home(r) for r in refs}
    assert all(h.startswith("gpulab.") and not h.startswith(("gpulab.grading", "gpulab.course")) for h in homes), homes


@pytest.mark.parametrize("name", LAB_MODULES)
def test_a_submission_that_calls_a_reference_is_refused(name: str) -> None:
    ref = next(r for r in importlib.import_module(name).REFERENCES if inspect.isfunction(r))

    sig = inspect.signature(ref)
    # placeholders for the required arguments: the call itself is what is refused, not what it computes
    args = [None for p in sig.parameters.values() if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kwargs = {p.name: None for p in sig.parameters.values() if p.default is p.empty and p.kind is p.KEYWORD_ONLY}

    def submission() -> None:
        try:
            ref(*args, **kwargs)
        except GradingError:
            raise
        except Exception:  # noqa: BLE001 - a reference given placeholders may raise; that is not the point
            pass

    with pytest.raises(GradingError):
        grading.check_not_calling(submission, forbidden=importlib.import_module(name).REFERENCES)
