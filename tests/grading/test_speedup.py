"""gpulab.grading.check_speedup: timed here interactively (target, or the reference's speed-up on a
machine short of cores); under the grader it only registers the work, which the grader times."""

from __future__ import annotations

import time

import pytest

from gpulab import grading
from gpulab.grading import GradingError, evidence
from gpulab.grading.speedup import SpeedupReport, TimedByGrader


def sleeper(seconds: float):
    return lambda seed: (time.sleep(seconds), seed % 7)[1]


def test_interactive_target_passes_and_fails_with_the_figures() -> None:
    report = grading.check_speedup(sleeper(0.01), sleeper(0.04), what="fast", at_least=2.0, repeats=3)
    assert isinstance(report, SpeedupReport) and 3.0 < report.speedup < 5.0 and "against the target" in str(report)
    with pytest.raises(GradingError, match=r"slow: needs at least 2.00x; measured yours 1\.\d\dx") as err:
        grading.check_speedup(sleeper(0.03), sleeper(0.04), what="slow", at_least=2.0, repeats=3, hint="look")
    assert "Hint: look" in str(err.value)


def test_interactive_short_of_cores_the_reference_sets_the_bar() -> None:
    # sleeping work uses no core, so the machine "had" fewer cores than min_cores: the reference decides
    report = grading.check_speedup(sleeper(0.03), sleeper(0.04), what="w", at_least=2.0, repeats=3,
                                   reference=sleeper(0.028))
    assert "relative to gpulab's reference" in report.passed_how
    with pytest.raises(GradingError, match="reference"):
        grading.check_speedup(sleeper(0.04), sleeper(0.04), what="w", at_least=2.0, repeats=3,
                              reference=sleeper(0.01))


def test_under_the_grader_nothing_is_timed_in_the_kernel(monkeypatch) -> None:
    sent: list = []
    monkeypatch.setattr(evidence, "emit", sent.append)
    monkeypatch.setenv("GPULAB_GRADING", "graded")
    ran: list = []
    out = grading.check_speedup(lambda s: ran.append(s), lambda s: ran.append(s), what="w", at_least=2.0)
    assert isinstance(out, TimedByGrader) and ran == [] and sent == [{"kind": "timed", "id": sent[0]["id"]}]
    monkeypatch.setenv("GPULAB_GRADING", "reference")
    grading.check_speedup(lambda s: 1, lambda s: 2, what="w", at_least=2.0, floor_s=0.1)
    assert sent[1]["spec"]["at_least"] == 2.0 and sent[1]["spec"]["floor_s"] == 0.1
    evidence.run_timed(sent[1]["id"], "baseline", 5)  # what the grader's request runs
    assert sent[2] == {"kind": "result", "value": 2}


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        grading.check_speedup(sleeper(0), sleeper(0), what="w", at_least=0)
    with pytest.raises(ValueError):
        grading.check_speedup(sleeper(0), sleeper(0), what="w", at_least=1, repeats=0)
