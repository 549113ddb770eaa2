"""gpulab.course.timing: the grader's speed rule, on figures it measured itself."""

from __future__ import annotations

from gpulab.course import timing
from gpulab.grading.evidence import encode

SPEC = {"what": "pipelined vs sequential", "at_least": 2.0, "repeats": 3, "relative": 0.85, "min_cores": 1.6,
        "band": 1.25, "floor_s": None, "rtol": 1e-4, "atol": 1e-5}


def runs(base: float, cand: float, cpus: int = 2, result: float = 1.0) -> timing.Runs:
    r = timing.Runs(cpus=cpus)
    r.times = {"baseline": [base] * 3, "candidate": [cand] * 3}
    r.results = {"baseline": [encode(result)] * 3, "candidate": [encode(result)] * 3}
    return r


def test_seeds_are_fresh_per_run_and_the_same_for_every_kernel() -> None:
    a = timing.run_seeds("secret", "nb", "cell", 0, warmup=1, repeats=3)
    assert a == timing.run_seeds("secret", "nb", "cell", 0, warmup=1, repeats=3)
    assert a != timing.run_seeds("other", "nb", "cell", 0, warmup=1, repeats=3)
    flat = a["warmup"] + a["baseline"] + a["candidate"]
    assert len(set(flat)) == len(flat) == 8
    order = timing.schedule(a)
    assert [t for _, _, t in order] == [False, False] + [True] * 6
    assert [r for r, _, t in order if t] == ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]


def test_the_target_on_the_graders_clock() -> None:
    why, figures = timing.speed_verdict(SPEC, runs(0.4, 0.1), runs(0.4, 0.12))
    assert why is None and "passed against the target" in figures and "timed by the grader" in figures
    why, _ = timing.speed_verdict(SPEC, runs(0.4, 0.3), runs(0.4, 0.12))
    assert why.startswith("pipelined vs sequential: needs at least 2.00x")


def test_a_slowed_baseline_counts_at_most_the_band() -> None:
    # the student's baseline is 3x the reference run's: it counts as 1.25x of it, and 0.5/0.25 = 2.0 fails
    why, figures = timing.speed_verdict(SPEC, runs(1.2, 0.26), runs(0.4, 0.12))
    assert why is not None and "counted as 500.0 ms" in why


def test_results_must_be_the_references_and_runs_cannot_beat_the_floor() -> None:
    why, _ = timing.speed_verdict(SPEC, runs(0.4, 0.1, result=2.0), runs(0.4, 0.1, result=1.0))
    assert "did not give the reference's result" in why
    why, _ = timing.speed_verdict({**SPEC, "floor_s": 0.2}, runs(0.4, 0.1), runs(0.4, 0.2))
    assert "less than the 200.0 ms its device work needs" in why


def test_short_of_cores_the_reference_on_as_many_cores_sets_the_bar() -> None:
    # one CPU: the reference's own speed-up there is 1.1x, and 0.95 x ... passes at 0.85 x 1.1
    why, figures = timing.speed_verdict(SPEC, runs(0.4, 0.40, cpus=1), runs(0.4, 0.36, cpus=1))
    assert why is None and "relative to the reference" in figures
    why, _ = timing.speed_verdict(SPEC, runs(0.4, 0.6, cpus=1), runs(0.4, 0.36, cpus=1))
    assert why is not None
    why, _ = timing.speed_verdict(SPEC, runs(0.4, 0.40, cpus=2), runs(0.4, 0.36, cpus=2))
    assert why is not None  # with the cores the target needs, the target it is


def test_runs_that_stopped_fail_with_their_reason() -> None:
    r = runs(0.4, 0.1)
    r.error = "the candidate run raised ValueError: x"
    assert "raised ValueError" in timing.speed_verdict(SPEC, r, runs(0.4, 0.1))[0]
    r = runs(0.4, 0.1)
    r.times["candidate"] = r.times["candidate"][:2]
    assert "did not all complete" in timing.speed_verdict(SPEC, r, runs(0.4, 0.1))[0]
