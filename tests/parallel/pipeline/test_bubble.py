"""gpulab.parallel.pipeline.bubble: the bubble formula, and the bubble measured on an ideal timeline."""

from __future__ import annotations

import pytest

from gpulab.parallel import StageEvent, bubble_fraction, measured_bubble


def test_bubble_fraction():
    assert bubble_fraction(1, 5) == 0
    assert bubble_fraction(2, 1) == pytest.approx(0.5)
    assert bubble_fraction(2, 8) == pytest.approx(1 / 9)
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    for bad in [(0, 2), (2, 0), (2.0, 3), (True, 3)]:
        with pytest.raises(ValueError):
            bubble_fraction(*bad)


@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 8), (3, 5), (4, 16)])
def test_measured_bubble_of_an_ideal_timeline_is_the_formula(stages, micro):
    ideal = [StageEvent(s, j, "forward", float(s + j), float(s + j + 1)) for s in range(stages) for j in range(micro)]
    assert measured_bubble(ideal) == pytest.approx(bubble_fraction(stages, micro))
    back = [StageEvent(s, j, "backward", 100.0 + (stages - 1 - s) + j, 101.0 + (stages - 1 - s) + j)
            for s in range(stages) for j in range(micro)]
    assert measured_bubble(ideal + back) == pytest.approx(bubble_fraction(stages, micro))
    with pytest.raises(ValueError):
        measured_bubble([])
