"""gpulab.grading.speedup: the target, or on a machine short of cores the reference's own speed-up."""

from __future__ import annotations

import pytest

from gpulab.grading import GradingError
from gpulab.grading.speedup import SpeedupMeasurement, check_speedup


def _measures(*figures):
    """A measure() that returns the given (yours, reference, cores) one after the other, and counts its calls."""
    queue = [SpeedupMeasurement(*f) for f in figures]
    calls = []

    def measure():
        calls.append(1)
        return queue[len(calls) - 1]

    return measure, calls


def test_the_target_passes_at_once():
    measure, calls = _measures((1.5, 1.6, 1.9))
    res = check_speedup(measure, at_least=1.3, what="x")
    assert not res.against_reference and len(calls) == 1 and "against the target" in str(res)


def test_short_of_cores_the_reference_sets_the_bar():
    measure, calls = _measures((1.1, 1.2, 1.0))  # 0.92 of the reference, on 1 core
    res = check_speedup(measure, at_least=1.3, relative=0.85, what="x")
    assert res.against_reference and "relative to the reference" in str(res)


def test_with_cores_to_spare_the_reference_is_no_excuse_and_later_attempts_count():
    measure, calls = _measures((1.1, 1.2, 1.9), (1.1, 1.2, 1.9), (1.35, 1.4, 1.9))
    res = check_speedup(measure, at_least=1.3, what="x")
    assert len(calls) == 3 and res.passed.yours == 1.35 and len(res.tried) == 3


def test_failure_lists_every_measurement_and_the_hint():
    measure, _ = _measures((1.0, 1.5, 1.9), (0.9, 1.4, 1.2), (1.0, 1.5, 1.0))
    with pytest.raises(GradingError, match=r"(?s)needs at least 1.30x.*yours 1.00x, reference 1.50x \(1.90 cores.*"
                                           r"yours 0.90x.*Hint: look here") as err:
        check_speedup(measure, at_least=1.3, relative=0.85, what="x", hint="look here")
    assert str(err.value).count("yours") == 3


def test_attempts_must_be_positive():
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        check_speedup(lambda: None, at_least=1.3, what="x", attempts=0)
