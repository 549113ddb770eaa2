"""gpulab.verdict.cell: a test cell's verdict from the reference run's checks and the student's values,
in order (whatever the student's kernel sent is only compared), a measured check's rule on what the
grader measured, and the reference run held to its own tests."""

from __future__ import annotations

from gpulab.autograde.expected import Expected
from gpulab.evidence.codec import encode
from gpulab.verdict import cell
from gpulab.verdict.cell import MeasuredRuns, judge_cell
from gpulab.verdict.rules import Measurement

REF = {"entries": [{"kind": "check", "spec": {"kind": "equal", "what": "backend"}, "value": "nccl"},
                   {"kind": "check", "spec": {"kind": "close", "what": "loss", "atol": 0.01}, "expected": 2.5,
                    "value": 2.5}],
       "error": ""}


def val(v):
    return {"kind": "check", "value": encode(v)}


def test_the_solutions_value_is_the_expected_one_and_a_literal_wins_over_it() -> None:
    assert judge_cell(REF, [val("nccl"), val(2.505)], {}, "").passed
    r = judge_cell(REF, [val("gloo"), val(2.5)], {}, "")
    assert not r.passed and r.message == "backend: expected 'nccl', got 'gloo'" and not r.note
    literal = {"entries": [{**REF["entries"][1], "value": 9.0}], "error": ""}  # the visible test's 2.5 decides
    assert judge_cell(literal, [val(2.5)], {}, "").passed


def test_missing_extra_forged_and_unreadable_values_fail() -> None:
    r = judge_cell(REF, [val("nccl")], {}, "ValueError: boom")
    assert "stopped before checking loss: ValueError: boom" in r.message
    r = judge_cell(REF, [val("nccl"), val(2.5), val(2.5)], {}, "")
    assert not r.passed and "1 more value" in r.message and r.note
    r = judge_cell(REF, [val("nccl"), {"kind": "check", "value": {"$pickle": "gASV"}}], {}, "")
    assert not r.passed and "could not be read" in r.message and r.note
    r = judge_cell(REF, [val("nccl"), {"kind": "result", "value": 1.0}], {}, "")
    assert not r.passed and r.note
    r = judge_cell(REF, [val("nccl"), {"kind": "check", "spec": {"kind": "true"}, "value": True, "expected": True}], {}, "")
    assert not r.passed  # a spec sent by the student's kernel is never read: "close" to 2.5 is still asked


def test_an_error_after_every_check_still_fails_and_masked_calls_are_noted() -> None:
    r = judge_cell(REF, [val("nccl"), val(2.5)], {}, "NameError: x")
    assert not r.passed and "then raised NameError" in r.message
    r = judge_cell(REF, [val("nccl")], {}, "MaskedReference: gpulab's reference x is not available")
    assert "masked" in r.note


def test_a_reference_run_that_fails_its_own_checks_is_refused(tmp_path) -> None:
    bad = {"entries": [{**REF["entries"][1], "value": 3.0}], "error": ""}
    exp = Expected("00_setup", 1, 1, {"00_setup": {"ok": REF, "bad": bad, "died": {"entries": [], "error": "X: y"}}})
    problems = exp.problems()
    assert len(problems) == 2 and any("bad" in p for p in problems) and any("raised X: y" in p for p in problems)
    exp.save(tmp_path / "e.json")
    assert oct((tmp_path / "e.json").stat().st_mode & 0o777) == "0o600"
    assert Expected.load(tmp_path / "e.json").cell("00_setup", "ok") == REF


MEASURED = {"kind": "measured", "what": "steps", "rule": "measure.wall", "repeats": 2, "rtol": 1e-4, "atol": 1e-5,
            "params": encode({"floor_s": 0.2, "at_most_s": 0.3})}


def runs(*walls: float, result: float = 1.0) -> MeasuredRuns:
    return MeasuredRuns([Measurement(w) for w in walls], [encode(result)] * len(walls))


def measured_ref(ref: MeasuredRuns) -> dict:
    return {"entries": [{"kind": "measured", "spec": MEASURED, "seeds": [1, 2, 3], "runs": ref.to_json()}], "error": ""}


def test_a_measured_check_is_judged_by_its_rule_on_the_least_of_the_runs() -> None:
    ref = measured_ref(runs(0.25, 0.26))
    ok = judge_cell(ref, [{"kind": "measured", "id": 0}], {0: runs(0.31, 0.28)}, "")
    assert ok.passed and "measured by the grader" in ok.figures[0]
    slow = judge_cell(ref, [{"kind": "measured", "id": 0}], {0: runs(0.35, 0.33)}, "")
    assert not slow.passed and "more than the 300.0 ms allowed" in slow.message
    fast = judge_cell(ref, [{"kind": "measured", "id": 0}], {0: runs(0.1, 0.25)}, "")
    assert not fast.passed and "was not done as written" in fast.message


def test_a_measured_run_must_give_the_references_result_and_complete() -> None:
    ref = measured_ref(runs(0.25, 0.26))
    wrong = judge_cell(ref, [{"kind": "measured", "id": 0}], {0: runs(0.25, 0.25, result=2.0)}, "")
    assert not wrong.passed and "did not give the reference's result" in wrong.message
    short = judge_cell(ref, [{"kind": "measured", "id": 0}], {0: runs(0.25)}, "")
    assert not short.passed and "did not all complete" in short.message
    stopped = judge_cell(ref, [{"kind": "measured", "id": 0}], {0: MeasuredRuns(error="the kernel died")}, "")
    assert not stopped.passed and "the kernel died" in stopped.message
    unannounced = judge_cell(ref, [val(1.0)], {}, "")
    assert not unannounced.passed and "did not hand its measured work" in unannounced.message


def test_seeds_are_fresh_per_run_and_the_same_for_every_kernel() -> None:
    a = cell.measured_seeds("secret", "nb", "cell", 0, 3)
    assert a == cell.measured_seeds("secret", "nb", "cell", 0, 3) != cell.measured_seeds("other", "nb", "cell", 0, 3)
    assert len(set(a)) == 3
