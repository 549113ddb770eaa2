"""gpulab.grading.exercises: unanswered exercises are named, demos fall back to the reference (issue 16)."""

from __future__ import annotations

import pytest

from gpulab.grading.exercises import answered, require, yours_or_reference


def _namespace() -> dict:
    # what a released notebook holds: stubs as nbgrader writes them, and one written answer
    ns: dict = {}
    exec(  # builds a notebook-like namespace for the test
        "def stub(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
        "def done(x):\n    return 2 * x\n"
        "class StubClass:\n    def __init__(self):\n        pass\n"
        "    def __iter__(self):\n        # YOUR CODE HERE\n        raise NotImplementedError()\n"
        "class DoneClass:\n    def __iter__(self):\n        return iter([1])\n"
        "def nested(x):\n    def inner():\n        raise NotImplementedError()\n    return inner\n",
        ns)
    return ns


def test_answered_tells_stubs_from_answers() -> None:
    ns = _namespace()
    assert answered(ns, "done") and answered(ns, "DoneClass")
    assert not answered(ns, "stub")
    assert not answered(ns, "StubClass"), "one stub method is enough"
    assert not answered(ns, "nested"), "a stub in a nested function counts"
    assert not answered(ns, "never_defined")


def test_require_names_the_exercise_and_never_raises_name_error() -> None:
    ns = _namespace()
    require(ns, "done", "DoneClass")
    with pytest.raises(NotImplementedError, match=r"exercise `stub` is not answered yet: write it"):
        require(ns, "done", "stub")
    with pytest.raises(NotImplementedError, match=r"exercise `LazyH5` is not answered yet: run its cell"):
        require(ns, "LazyH5")


def test_demos_use_the_reference_until_the_answer_exists(capsys) -> None:
    ns = _namespace()
    ref = lambda x: 2 * x
    assert yours_or_reference(ns, "stub", ref) is ref
    assert "exercise `stub` is not answered yet" in capsys.readouterr().out
    assert yours_or_reference(ns, "done", ref) is ns["done"]
    assert capsys.readouterr().out == ""


def test_a_demo_needs_every_exercise_its_answer_calls(capsys) -> None:
    ns = _namespace()
    ref = object()
    assert yours_or_reference(ns, "done", ref, needs=("stub",)) is ref
    assert "exercise `stub` is not answered yet" in capsys.readouterr().out
    assert yours_or_reference(ns, "done", ref, needs=("DoneClass",)) is ns["done"]
