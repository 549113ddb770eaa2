"""gpulab.course.judge: a test cell's verdict from the reference run's checks and the student's values,
in order (whatever the student's kernel sent is only compared), and the speed rule on figures the
grader measured itself."""

from __future__ import annotations

import pytest

from gpulab.course import judge
from gpulab.course.judge import Expected, judge_cell
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

SPEC = {"what": "pipelined vs sequential", "at_least": 2.0, "repeats": 3, "relative": 0.85, "min_cores": 1.6,
        "band": 1.25, "floor_s": None, "rtol": 1e-4, "atol": 1e-5}


def runs(base: float, cand: float, cpus: int = 2, result: float = 1.0) -> judge.Runs:
    r = judge.Runs(cpus=cpus)
    r.times = {"baseline": [base] * 3, "candidate": [cand] * 3}
    r.results = {"baseline": [encode(result)] * 3, "candidate": [encode(result)] * 3}
    return r


def test_seeds_are_fresh_per_run_and_the_same_for_every_kernel() -> None:
    a = judge.run_seeds("secret", "nb", "cell", 0, warmup=1, repeats=3)
    assert a == judge.run_seeds("secret", "nb", "cell", 0, warmup=1, repeats=3)
    assert a != judge.run_seeds("other", "nb", "cell", 0, warmup=1, repeats=3)
    flat = a["warmup"] + a["baseline"] + a["candidate"]
    assert len(set(flat)) == len(flat) == 8
    order = judge.schedule(a)
    assert [t for _, _, t in order] == [False, False] + [True] * 6
    assert [r for r, _, t in order if t] == ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]


def test_the_target_on_the_graders_clock() -> None:
    why, figures = judge.speed_verdict(SPEC, runs(0.4, 0.1), runs(0.4, 0.12))
    assert why is None and "passed against the target" in figures and "timed by the grader" in figures
    why, _ = judge.speed_verdict(SPEC, runs(0.4, 0.3), runs(0.4, 0.12))
    assert why.startswith("pipelined vs sequential: needs at least 2.00x")


def test_a_slowed_baseline_counts_at_most_the_band() -> None:
    # the student's baseline is 3x the reference run's: it counts as 1.25x of it, and 0.5/0.25 = 2.0 fails
    why, figures = judge.speed_verdict(SPEC, runs(1.2, 0.26), runs(0.4, 0.12))
    assert why is not None and "counted as 500.0 ms" in why


def test_a_busier_machine_raises_the_cap_by_the_graders_probes_and_no_further_than_the_limit() -> None:
    # a second grading job beside the student's: baseline 0.6 vs the reference's 0.4 (1.5x), candidate 0.28;
    # the grader's own probe took 1.5x as long too, so the cap rises to 1.25 x 1.25 x 0.4 = 0.625 and the baseline
    # counts in full: 0.6 / 0.28 = 2.14 passes
    mine, ref = runs(0.6, 0.28), runs(0.4, 0.12)
    why, _ = judge.speed_verdict(SPEC, mine, ref)
    assert why is not None and "counted as 500.0 ms" in why  # no probes: the plain band, 500 / 280 = 1.79 fails
    mine.probes, ref.probes = [0.015, 0.016, 0.014], [0.010, 0.010, 0.011]
    why, figures = judge.speed_verdict(SPEC, mine, ref)
    assert why is None and "counted as" not in figures
    # a kernel that loads the machine during the probes gains at most LOAD_LIMIT: 1.25 x 1.25 x 400 = 625 ms
    slowed = runs(1.2, 0.41)
    slowed.probes = [0.1] * 3  # 10x as busy, by its own account
    why, _ = judge.speed_verdict(SPEC, slowed, ref)
    assert why is not None and "counted as 625.0 ms: at most 1.56 x the reference run's" in why
    assert "the machine was 1.25x as busy" in why
    # probes survive the trip through JSON; a malformed one is dropped
    data = slowed.to_json() | {"probes": [0.1, "x", -1, 0.2]}
    assert judge.Runs.from_json(data).probes == [0.1, 0.2]
    assert judge.load_factor(runs(1, 1), ref) == 1.0  # a run without probes (an older reference) is not scaled
    quiet = runs(1, 1)
    quiet.probes = [0.007] * 3
    assert judge.load_factor(quiet, ref) == pytest.approx(0.7)  # the reference ran on the busier machine
    quiet.probes = [0.001] * 3
    assert judge.load_factor(quiet, ref) == judge.LOAD_FLOOR  # one odd probe lowers the cap no further


def test_a_reference_run_on_a_busier_machine_lowers_the_cap() -> None:
    """The attack CI let through: the reference ran while the machine was 1.5x as busy (its baseline
    0.6 s, not 0.4), the student's kernel had it to itself, slowed its own baseline to 1.2 s and wrote
    a candidate 1.1x faster than an honest baseline (0.364 s). A cap of 1.25 x 0.6 passed it (2.06x);
    with the probes' 1/1.5 the cap is 1.25 x 0.4, and 1.37x fails. An honest student on the same
    quiet machine (baseline 0.4, candidate 0.19) still passes, uncapped."""
    ref = runs(0.6, 0.18)
    ref.probes = [0.015] * 3
    slowed = runs(1.2, 0.364)
    slowed.probes = [0.010] * 3
    why, _ = judge.speed_verdict(SPEC, slowed, ref)
    assert why is not None and "counted as 500.0 ms" in why and "the reference ran on a machine 1.50x as busy" in why
    honest = runs(0.4, 0.19)
    honest.probes = [0.010] * 3
    why, figures = judge.speed_verdict(SPEC, honest, ref)
    assert why is None and "counted as" not in figures


def test_results_must_be_the_references_and_runs_cannot_beat_the_floor() -> None:
    why, _ = judge.speed_verdict(SPEC, runs(0.4, 0.1, result=2.0), runs(0.4, 0.1, result=1.0))
    assert "did not give the reference's result" in why
    why, _ = judge.speed_verdict({**SPEC, "floor_s": 0.2}, runs(0.4, 0.1), runs(0.4, 0.2))
    assert "less than the 200.0 ms its device work needs" in why


def test_short_of_cores_the_reference_on_as_many_cores_sets_the_bar() -> None:
    # one CPU: the reference's own speed-up there is 1.1x, and 0.95 x ... passes at 0.85 x 1.1
    why, figures = judge.speed_verdict(SPEC, runs(0.4, 0.40, cpus=1), runs(0.4, 0.36, cpus=1))
    assert why is None and "relative to the reference" in figures
    why, _ = judge.speed_verdict(SPEC, runs(0.4, 0.6, cpus=1), runs(0.4, 0.36, cpus=1))
    assert why is not None
    why, _ = judge.speed_verdict(SPEC, runs(0.4, 0.40, cpus=2), runs(0.4, 0.36, cpus=2))
    assert why is not None  # with the cores the target needs, the target it is


def test_runs_that_stopped_fail_with_their_reason() -> None:
    r = runs(0.4, 0.1)
    r.error = "the candidate run raised ValueError: x"
    assert "raised ValueError" in judge.speed_verdict(SPEC, r, runs(0.4, 0.1))[0]
    r = runs(0.4, 0.1)
    r.times["candidate"] = r.times["candidate"][:2]
    assert "did not all complete" in judge.speed_verdict(SPEC, r, runs(0.4, 0.1))[0]
