"""gpulab.memory.trend: the leak criterion on made-up histories (a pure function), and its bad arguments."""

from __future__ import annotations

import pytest

from gpulab.memory import LeakCriterion


@pytest.mark.parametrize("history,expected", [
    ([100] * 12, False),
    ([100 + 5000 * i for i in range(12)], True),
    ([100] * 6 + [10**6] * 6, False),  # one jump
    ([100 + 5000 * i for i in range(11)] + [0], False),  # freed at the end: the last floor drops
    ([100 + 5000 * i for i in range(8)], False),  # too few steps to judge
])
def test_criterion_on_histories(history, expected) -> None:
    assert LeakCriterion().check(history) is expected


def test_criterion_bad_arguments_name_the_fix() -> None:
    with pytest.raises(ValueError, match="segments"):
        LeakCriterion(segments=1)
    with pytest.raises(ValueError, match="2 \\* segments"):
        LeakCriterion(window=5, segments=4)
