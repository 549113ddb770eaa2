"""gpulab.grading's checks in their three modes: interactively they pass on right answers and fail
with student-facing messages; in the student's graded kernel they send only the student's value
and nothing else; in the reference kernel they send the check and the solution's value (the expected
side), with a visible test's literal, which the grader's judge then decides exactly as the
interactive check did.
"""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from gpulab import grading
from gpulab.evidence import wire
from gpulab.evidence.codec import Dtype, EvidenceError, decode, encode
from gpulab.evidence.records import to_wire
from gpulab.grading import GradingError
from gpulab.verdict import check as judge


@pytest.fixture
def sent(monkeypatch):
    """What checks send, in a graded or reference kernel (``sent.mode = ...``)."""
    class Sent(list):
        def mode(self, m: str) -> None:
            monkeypatch.setenv("GPULAB_GRADING", m)

    out = Sent()
    monkeypatch.setattr(wire, "emit", lambda record: out.append(to_wire(record)))
    return out


def test_grading_error_is_an_assertion_error() -> None:
    assert issubclass(GradingError, AssertionError)


def test_check_and_hint() -> None:
    grading.check(True, "fine")
    with pytest.raises(GradingError, match=r"the sum: check failed\n  Hint: add them"):
        grading.check(False, "the sum", hint="add them")


def test_check_close_reports_shape_dtype_and_values() -> None:
    x = torch.ones(2, 3)
    grading.check_close(x.clone(), x, what="ones")
    with pytest.raises(GradingError, match=r"shape \(3, 2\) but expected \(2, 3\)"):
        grading.check_close(torch.ones(3, 2), x, what="t")
    with pytest.raises(GradingError, match="dtype torch.float64"):
        grading.check_close(x.double(), x, what="t")
    with pytest.raises(GradingError, match="values differ"):
        grading.check_close(x + 1e-2, x, what="t")
    with pytest.raises(GradingError, match="expected a torch.Tensor, got list"):
        grading.check_close([1.0], x, what="t")
    grading.check_close(1.0 + 1e-9, 1.0, what="floats")


def test_check_equal_shape_between() -> None:
    grading.check_equal([1, 2], [1, 2], what="list")
    with pytest.raises(GradingError, match=r"expected 'nccl', got 'gloo'"):
        grading.check_equal("gloo", "nccl", what="backend")
    with pytest.raises(GradingError, match="shape"):
        grading.check_shape(torch.ones(2), (3,), what="t")
    grading.check_between(0.5, 0, 1, what="fraction")
    with pytest.raises(GradingError, match="below the minimum"):
        grading.check_between(-1, 0, 1, what="fraction")
    with pytest.raises(GradingError, match="NaN"):
        grading.check_between(float("nan"), 0, 1, what="fraction")


def test_check_raises() -> None:
    assert grading.check_raises(ValueError, int, "x", what="int('x')") is None  # no Out[] holding an exception
    err = grading.catch(ValueError, int, "x", what="int('x')")
    assert isinstance(err, ValueError)
    with pytest.raises(GradingError, match="nothing was raised"):
        grading.check_raises(ValueError, int, "3", what="int('3')")
    with pytest.raises(GradingError, match="expected ValueError, got ZeroDivisionError"):
        grading.check_raises(ValueError, lambda: 1 / 0, what="div")
    with pytest.raises(GradingError, match="does not mention"):
        grading.check_raises(ValueError, int, "x", what="int", match="world_size")


def test_graded_kernel_sends_values_and_nothing_else(sent) -> None:
    """The student's kernel sends its value only: no spec, no bounds, no expected value, and a plain
    ``check`` sends nothing at all (a boolean the kernel computed is no evidence)."""
    sent.mode("graded")
    grading.check_equal(3, what="a")   # wrong against any reference, yet nothing raises here
    grading.check_close(torch.ones(2), torch.zeros(2), what="b")  # a visible literal stays in the kernel's test only
    grading.check(False, "c")
    grading.check_raises(ValueError, int, "x", what="d")
    grading.check_between(5.0, 0.0, 1.0, what="e")
    grading.check_rule({"x": 1}, "lab00.placement", what="f", world_size=3)
    assert [r["kind"] for r in sent] == ["check"] * 5
    assert all(set(r) == {"kind", "value"} for r in sent), sent
    assert decode(sent[0]["value"]) == 3 and decode(sent[2]["value"]).types[0] == "ValueError"


def test_reference_kernel_sends_the_check_and_the_solutions_value(sent) -> None:
    """In the reference kernel, a hidden test's check (no expected value) sends the solution's value,
    which is then the expected one; a visible test's literal travels beside it."""
    sent.mode("reference")
    grading.check_equal("nccl", what="backend")
    grading.check_equal("gloo", "nccl", what="visible backend")
    grading.check(False, "not evidence")
    assert [set(r) for r in sent] == [{"kind", "spec", "value"}, {"kind", "spec", "value", "expected"}]
    assert decode(sent[0]["value"]) == "nccl" and decode(sent[1]["expected"]) == "nccl"


def test_the_judge_decides_like_the_interactive_check(sent) -> None:
    sent.mode("reference")
    cases = [(lambda e: grading.check_equal("gloo", e, what="backend"), "nccl"),
             (lambda e: grading.check_close(torch.ones(2), e, what="ones", atol=1e-3), torch.ones(2) + 1e-2),
             (lambda e: grading.check_equal((1, 2), e, what="pair"), namedtuple("P", "a b")(1, 2))]
    for call, expected in cases:
        call(expected)
    verdicts = [judge.verdict(r["spec"], decode(r["value"]), decode(r["expected"])) for r in sent]
    for (call, expected), why in zip(cases, verdicts):
        with pytest.raises(GradingError) as err:  # the same check, interactively
            evidence_mode_interactive(call, expected)
        assert str(err.value) == why


def test_a_hidden_check_decides_nothing_interactively() -> None:
    """Run in the source notebook interactively, a hidden test has no expected value to compare with."""
    assert grading.check_equal(3, what="a hidden test's check") is None


def evidence_mode_interactive(call, expected) -> None:
    import os

    saved = os.environ.pop("GPULAB_GRADING")
    try:
        call(expected)
    finally:
        os.environ["GPULAB_GRADING"] = saved


def test_close_agrees_with_torch_testing_assert_close() -> None:
    """The judge's "close" is torch.testing.assert_close's, dtype by dtype, on the grader's side."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        base = torch.randn(64, generator=gen).to(dtype)
        for scale in (0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2):
            other = (base.double() * (1 + scale) + scale).to(dtype)
            try:
                torch.testing.assert_close(other, base)
                torch_ok = True
            except AssertionError:
                torch_ok = False
            ours = judge.verdict({"kind": "close", "what": "t"}, decode(encode(other)),
                                 decode(encode(base)))
            assert (ours is None) == torch_ok, (dtype, scale, ours)


def test_evidence_round_trips_and_hostile_data_is_refused() -> None:
    P = namedtuple("P", "x y")
    value = {"t": torch.arange(6, dtype=torch.int16).reshape(2, 3), "b": torch.tensor([1.5], dtype=torch.bfloat16),
             "meta": torch.empty(3, device="meta"), "p": P(1, "a"), "s": {3, 4}, "n": float("nan"), "big": 2**80,
             "dt": torch.uint8, "exc": KeyError("k")}
    back = decode(encode(value))
    assert back["t"] == decode(encode(torch.arange(6, dtype=torch.int16).reshape(2, 3)))
    assert float(back["b"].array[0]) == 1.5 and back["meta"].array is None and back["big"] == 2**80
    assert back["p"] == (1, "a") and back["dt"] == Dtype("uint8") and back["exc"].types[0] == "KeyError"
    for hostile in ({"$tensor": {"dtype": "float32", "shape": [10**6], "data": "AAAA"}}, {"$pickle": "x"},
                    {"$tensor": {"dtype": "object", "shape": [1], "data": ""}}, {"a": 1, "b": 2},
                    {"$int": "9" * 5000}, eval("[" * 40 + "]" * 40)):
        with pytest.raises(EvidenceError):
            decode(hostile)


def test_objects_that_lie_are_only_what_they_encode_to() -> None:
    class Liar:
        def __eq__(self, other):
            return True

        def __bool__(self):
            return True

    class LyingStr(str):
        def __eq__(self, other):
            return True

    assert judge.verdict({"kind": "equal"}, decode(encode(Liar())), "nccl") is not None
    assert judge.verdict({"kind": "equal"}, decode(encode(LyingStr("gloo"))), "nccl") is not None
    assert judge.verdict({"kind": "close"}, decode(encode(float("nan"))), 1.0) is not None
