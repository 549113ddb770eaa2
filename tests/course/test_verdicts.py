"""gpulab.course.verdicts: a test cell's verdict from the reference run's checks and the student's
values, in order; whatever the student's kernel sent is only compared."""

from __future__ import annotations

from gpulab.course.verdicts import Expected, judge_cell
from gpulab.grading.evidence import encode

REF = {"entries": [{"kind": "check", "spec": {"kind": "equal", "what": "backend"}, "expected": "nccl", "value": "nccl"},
                   {"kind": "check", "spec": {"kind": "close", "what": "loss", "atol": 0.01}, "expected": 2.5,
                    "value": 2.5}],
       "error": ""}


def val(v):
    return {"kind": "check", "value": encode(v)}


def test_the_right_values_pass_and_the_first_wrong_one_is_named() -> None:
    assert judge_cell(REF, [val("nccl"), val(2.505)], {}, "").passed
    r = judge_cell(REF, [val("gloo"), val(2.5)], {}, "")
    assert not r.passed and r.message == "backend: expected 'nccl', got 'gloo'" and not r.note


def test_missing_extra_forged_and_unreadable_values_fail() -> None:
    r = judge_cell(REF, [val("nccl")], {}, "ValueError: boom")
    assert "stopped before checking loss: ValueError: boom" in r.message
    r = judge_cell(REF, [val("nccl"), val(2.5), val(2.5)], {}, "")
    assert not r.passed and "1 more value" in r.message and r.note
    r = judge_cell(REF, [val("nccl"), {"kind": "check", "value": {"$pickle": "gASV"}}], {}, "")
    assert not r.passed and "could not be read" in r.message and r.note
    r = judge_cell(REF, [val("nccl"), {"kind": "result", "value": 1.0}], {}, "")
    assert not r.passed and r.note
    r = judge_cell(REF, [val("nccl"), {"kind": "check", "spec": {"kind": "true"}, "value": True, "expected": True}],
                   {}, "")
    assert not r.passed  # a spec sent by the student's kernel is never read: "close" to 2.5 is still asked


def test_an_error_after_every_check_still_fails_and_masked_calls_are_noted() -> None:
    r = judge_cell(REF, [val("nccl"), val(2.5)], {}, "NameError: x")
    assert not r.passed and "then raised NameError" in r.message
    r = judge_cell(REF, [val("nccl")], {}, "MaskedReference: gpulab's reference x is not available")
    assert "masked" in r.note


def test_a_reference_run_that_fails_its_own_checks_is_refused(tmp_path) -> None:
    bad = {"entries": [{**REF["entries"][0], "value": "gloo"}], "error": ""}
    exp = Expected("00_setup", 1, 1, {"00_setup": {"ok": REF, "bad": bad, "died": {"entries": [], "error": "X: y"}}})
    problems = exp.problems()
    assert len(problems) == 2 and any("bad" in p for p in problems) and any("raised X: y" in p for p in problems)
    exp.save(tmp_path / "e.json")
    assert oct((tmp_path / "e.json").stat().st_mode & 0o777) == "0o600"
    assert Expected.load(tmp_path / "e.json").cell("00_setup", "ok") == REF
