"""gpulab.launchbound.overhead: the knee of time-per-op against size, on known curves and on a measured one."""

from __future__ import annotations

import pytest
import torch

from gpulab.launchbound.overhead import OpTiming, fit_overhead, op_times, overhead_bound_below


def curve(overhead_s: float, per_element_s: float, sizes=tuple(4**k for k in range(1, 11))) -> list[OpTiming]:
    return [OpTiming(n, overhead_s + n * per_element_s) for n in sizes]


def test_the_knee_is_where_the_arithmetic_equals_the_overhead() -> None:
    timings = curve(5e-6, 1e-9)  # equal at n = 5000
    assert overhead_bound_below(timings) == 4096
    assert overhead_bound_below(timings, factor=1.5) == 1024  # n <= 2500
    assert fit_overhead(timings) == pytest.approx((5e-6 + 4e-9, 1e-9))
    assert overhead_bound_below([OpTiming(16, 1e-5), OpTiming(4, 1e-5)]) == 16  # only the floor: all of it


def test_a_noisy_dip_after_the_knee_does_not_count() -> None:
    timings = curve(5e-6, 1e-9) + [OpTiming(4**12, 1e-6)]  # a bogus fast big op, past the knee
    assert overhead_bound_below(timings) == 4096  # the floor comes from the smallest sizes, the scan stops at the knee
    shuffled = list(reversed(curve(5e-6, 1e-9)))
    assert overhead_bound_below(shuffled) == 4096  # order of the timings does not matter


def test_measured_curve_is_flat_then_rises() -> None:
    timings = op_times(sizes=(16, 256, 2**20), budget_s=0.002)
    assert [t.numel for t in timings] == [16, 256, 2**20]
    assert timings[-1].seconds > timings[0].seconds  # a million elements cost more than sixteen
    assert torch.get_num_threads() >= 1


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        overhead_bound_below([])
    with pytest.raises(ValueError):
        overhead_bound_below(curve(1e-6, 1e-9), factor=1.0)
