"""Is the student's exercise written yet? What Run All does in a lab that is not answered yet.

A released lab replaces each answer with ``raise NotImplementedError()``. Two things follow, and
this module handles both (the notebooks import it; it imports nothing of gpulab):

- a **demo** cell that needs an exercise uses gpulab's reference until the student's version
  exists, and says so, so the lab's plots and measurements appear from the first Run All
  (:func:`yours_or_reference`);
- a **test** cell whose exercise is missing fails with a message that names the exercise
  (:func:`require`), never with ``NameError: name 'peaks_0' is not defined``.

An exercise counts as answered once its ``raise NotImplementedError()`` is gone: a function, or
any method of a class, whose code still raises it (nested functions included) is unanswered, and
so is a name that was never defined (an exercise cell that raised before it got to the ``def``).

    from gpulab.grading.exercises import require, yours_or_reference
    scatter_ = yours_or_reference(globals(), "scatter", gpulab_scatter)   # in a demo cell
    require(globals(), "scatter")                                         # first line of a test cell
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

_STUB = "NotImplementedError"


def _raises_stub(code: types.CodeType) -> bool:
    """True when this code object, or one nested in it, names NotImplementedError."""
    if _STUB in code.co_names:
        return True
    return any(isinstance(c, types.CodeType) and _raises_stub(c) for c in code.co_consts)


def _codes(obj: Any) -> list[types.CodeType]:
    """The code objects of a function, a bound method, or the methods a class defines itself."""
    obj = getattr(obj, "__func__", obj)
    if hasattr(obj, "__code__"):
        return [obj.__code__]
    if isinstance(obj, type):
        codes = []
        for member in vars(obj).values():
            member = getattr(member, "__func__", member)  # staticmethod / classmethod
            if isinstance(member, property):
                member = member.fget
            if hasattr(member, "__code__"):
                codes.append(member.__code__)
        return codes
    return []


def answered(namespace: Mapping[str, Any], name: str) -> bool:
    """Whether the exercise ``name`` is defined in ``namespace`` and no longer raises the stub.

    Args:
        namespace: where the student's cells define things; in a notebook, ``globals()``.
        name: the function or class the exercise asks for.

    Returns:
        False while the name is missing or its code still holds ``raise NotImplementedError()``.
    """
    if name not in namespace:
        return False
    return not any(_raises_stub(code) for code in _codes(namespace[name]))


def require(namespace: Mapping[str, Any], *names: str) -> None:
    """Stop a test cell at once, naming the exercise, when one it needs is not answered.

    Args:
        namespace: ``globals()`` of the notebook.
        *names: the exercises this test cell checks.

    Raises:
        NotImplementedError: "exercise `X` is not answered yet: ...", for the first missing one.
    """
    for name in names:
        if not answered(namespace, name):
            where = "write it in its cell above" if name in namespace else "run its cell above (it is not defined yet)"
            raise NotImplementedError(
                f"exercise `{name}` is not answered yet: {where}, where it says YOUR CODE HERE, and delete "
                f"the `raise NotImplementedError()` line; then run this test cell again")


def masked(reference: Any) -> bool:
    """Whether ``reference`` is one of gpulab's references masked while this lab is graded
    (:mod:`gpulab.autograde.box.mask`: its code only raises ``gpulab.MaskedReference``)."""
    return any("MaskedReference" in code.co_names for code in _codes(reference))


def yours_or_reference(namespace: Mapping[str, Any], name: str, reference: Any, *, needs: Sequence[str] = ()) -> Any:
    """The student's ``name`` once it is answered; until then gpulab's ``reference``, and a note saying so.

    For demo and measurement cells only: tests never fall back (see :func:`require`). While the
    lab is graded the reference is masked, so an unanswered exercise's demo stops at once, naming
    the exercise (no test may depend on such a demo's results).

    Args:
        namespace: ``globals()`` of the notebook.
        name: the exercise.
        reference: gpulab's implementation with the same signature.
        needs: other exercises the student's version calls (all must be answered to use it).

    Returns:
        The object to use in the demo.
    """
    missing = [n for n in (name, *needs) if not answered(namespace, n)]
    if not missing:
        return namespace[name]
    names = ", ".join(f"`{n}`" for n in missing)
    if masked(reference):
        raise NotImplementedError(f"exercise {names} is not answered yet, and gpulab's reference is not available "
                                  "while this lab is graded: this cell needs your version")
    print(f"(exercise {names} {'is' if len(missing) == 1 else 'are'} not answered yet, so this cell uses "
          f"gpulab's reference for `{name}`; run it again once yours is written)")
    return reference
