"""gpulab.launchbound.overhead: the knee of time-per-op against size, on known curves and on a measured one; the
sweep a GPU gets (to 4^14 elements, or until the time per op grows in step with the size)."""

from __future__ import annotations

import pytest
import torch

from gpulab.launchbound import overhead
from gpulab.launchbound.overhead import (
    CUDA_SIZES,
    SIZES,
    OpTiming,
    fit_overhead,
    grows_linearly,
    op_times,
    overhead_bound_below,
    sweep_sizes,
)


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


def test_the_sweep_reaches_past_4m_elements_only_on_a_gpu() -> None:
    assert sweep_sizes(torch.device("cpu")) == SIZES and SIZES[-1] == 4**11
    assert sweep_sizes(torch.device("cuda")) == CUDA_SIZES and CUDA_SIZES[-1] == 4**14
    assert CUDA_SIZES[:len(SIZES)] == SIZES


def test_linear_growth_is_a_time_ratio_near_the_size_ratio() -> None:
    timings = curve(5e-6, 1e-9, sizes=tuple(4**k for k in range(5, 10)))  # 9.1, 21.4, 70.5, 267 µs from 4^6 on
    assert not grows_linearly(timings[:3])  # 4^6 -> 4^7 is 2.3x: the overhead still shows
    assert not grows_linearly(timings[:4])  # one step of 3.3x is not two
    assert grows_linearly(timings)  # 3.3x, then 3.8x: in step with the size
    assert not grows_linearly(curve(5e-6, 0.0))  # flat: all overhead
    assert not grows_linearly(timings[:1]) and not grows_linearly(timings, steps=0)


def _timed_sizes(monkeypatch: pytest.MonkeyPatch, seconds, free_bytes: int = 2**40) -> list[int]:
    """The sizes op_times times on a (pretend) GPU whose op takes seconds(n), and the sizes it returned."""
    timed: list[int] = []

    def fake_time_size(n, op, device, budget_s, repeats):
        timed.append(n)
        return OpTiming(n, seconds(n))

    monkeypatch.setattr(overhead, "_time_size", fake_time_size)
    monkeypatch.setattr(overhead.torch.cuda, "mem_get_info", lambda device=None: (free_bytes, free_bytes))
    got = op_times(device=torch.device("cuda"))
    assert [t.numel for t in got] == timed
    return timed


def test_a_gpu_sweep_stops_once_time_grows_with_size(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _timed_sizes(monkeypatch, lambda n: 5e-6 + n * 1e-9)[-1] == 4**9  # the second 3x+ step
    assert _timed_sizes(monkeypatch, lambda n: 8e-6 + n * 1e-13) == list(CUDA_SIZES)  # a fast GPU: to 4^14
    assert _timed_sizes(monkeypatch, lambda n: 8e-6, free_bytes=3 * 4 * 4**10)[-1] == 4**10  # 4^11 would not fit


def test_a_cpu_sweep_is_not_cut_short(monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[int] = []
    monkeypatch.setattr(overhead, "_time_size", lambda n, *rest: timed.append(n) or OpTiming(n, 5e-6 + n * 1e-9))
    assert [t.numel for t in op_times(device=torch.device("cpu"))] == list(SIZES) == timed
    timed.clear()
    assert op_times(device=torch.device("cpu"), until_linear=True)[-1].numel == 4**9  # only when asked
