"""gpulab.memory.find_max_batch_size: exact against an analytic budget, on a real model against a
direct check of the answer and the next size, and every bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gpulab.devices import MemoryMeter, logical_devices
from gpulab.memory import find_max_batch_size
from gpulab.memory.batch_size import bisect_largest
from gpulab.models import SmallCNN

F32 = 4
ROW = 1000 * F32  # bytes per sample of one (B, 1000) float32 tensor


def analytic_step(batch_size: int) -> None:
    """Holds two (B, 1000) float32 tensors at once: the peak is exactly 2 * B * ROW bytes."""
    x = torch.empty(batch_size, 1000)
    y = x * 2
    del x, y


@pytest.mark.parametrize("fits,slack,lo,hi", [(37, 100, 1, 500), (1, 0, 1, 64), (64, 2 * ROW - 1, 1, 64),
                                              (100, 5, 3, 1000), (17, 0, 17, 17), (255, ROW, 1, 256)])
def test_exact_against_an_analytic_budget(fits, slack, lo, hi) -> None:
    budget = 2 * ROW * fits + slack  # batch `fits` fits, fits + 1 needs 2 * ROW more than that
    log = []
    assert find_max_batch_size(analytic_step, lo, hi, budget=budget, log=log) == min(fits, hi)
    assert len(log) <= math.ceil(math.log2(hi - lo + 1)) + 2  # a binary search, not a scan
    for batch, ok, peak in log:
        assert ok == (batch <= fits)
        assert peak == (2 * ROW * batch if ok else None)


def test_tracked_model_counts_against_the_budget() -> None:
    model = nn.Linear(100, 100)
    params = (100 * 100 + 100) * F32
    assert find_max_batch_size(analytic_step, 1, 100, budget=2 * ROW * 30, track=model) < 30
    assert find_max_batch_size(analytic_step, 1, 100, budget=params + 2 * ROW * 30, track=model) == 30


def test_a_real_step_answer_fits_and_the_next_size_does_not() -> None:
    torch.manual_seed(0)
    model = SmallCNN(channels=(8, 16))
    dev = logical_devices(1, physical=["cpu"])[0]

    def step(batch_size: int) -> None:
        x = torch.randn(batch_size, 3, 16, 16)
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)

    budget = 3 * 2**20
    best = find_max_batch_size(step, 1, 1024, budget=budget, track=model)

    def fits(b: int) -> bool:
        meter = MemoryMeter(budget)
        meter.track(model, dev)
        try:
            with meter:
                step(b)
            return True
        except torch.OutOfMemoryError:
            return False

    assert 1 < best < 1024
    assert fits(best) and not fits(best + 1)


def test_bad_inputs_get_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"lo=10 > hi=5.*swapped\? lo=5, hi=10"):
        find_max_batch_size(analytic_step, 10, 5, budget=10**6)
    with pytest.raises(ValueError, match="lo must be an int >= 1"):
        find_max_batch_size(analytic_step, 0, 5, budget=10**6)
    with pytest.raises(ValueError, match="hi must be an int"):
        find_max_batch_size(analytic_step, 1, 5.0, budget=10**6)
    with pytest.raises(ValueError, match="budget is bytes"):
        find_max_batch_size(analytic_step, 1, 5, budget=-1)
    with pytest.raises(TypeError, match="step_fn"):
        find_max_batch_size(None, 1, 5, budget=10**6)


def test_a_budget_too_small_for_lo_says_so() -> None:
    with pytest.raises(ValueError, match=r"even batch_size=lo=2 does not fit in a budget of 15.62 KiB") as err:
        find_max_batch_size(analytic_step, 2, 8, budget=2 * ROW * 2 - 1)
    assert "Tried to allocate" in str(err.value)  # the meter's own message, for the sizes


def test_a_model_alone_too_big_for_the_budget_says_so() -> None:
    with pytest.raises(ValueError, match="even batch_size=lo=1"):
        find_max_batch_size(analytic_step, 1, 8, budget=1000, track=nn.Linear(100, 100))


def test_other_exceptions_are_re_raised_unchanged() -> None:
    boom = KeyError("a bug in the step, not memory")
    calls = []

    def step(batch_size: int) -> None:
        calls.append(batch_size)
        if batch_size > 4:
            raise boom
        torch.empty(batch_size)

    with pytest.raises(KeyError) as err:
        find_max_batch_size(step, 1, 64, budget=10**6)
    assert err.value is boom and calls == [1, 64]  # the same object, raised at the first failing try


def test_no_budget_needs_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: no budget means the real GPU")
    with pytest.raises(ValueError, match="Pass budget="):
        find_max_batch_size(analytic_step, 1, 8)


@pytest.mark.gpu
def test_real_gpu_search_finds_a_size_that_fits() -> None:
    def step(batch_size: int) -> None:
        torch.empty(batch_size, 2**20, device="cuda")  # 4 MiB per sample

    torch.cuda.empty_cache()  # the search empties the cache between tries: blocks earlier tests left count as free
    free, _ = torch.cuda.mem_get_info()
    best = find_max_batch_size(step, 1, 2 * free // (4 * 2**20), device="cuda")
    assert 0.9 * free <= best * 4 * 2**20 <= free  # seen on an H200: 35,633 samples, 12 MiB under the free memory


@pytest.mark.parametrize("threshold,good,bad,multiple", [(37, 1, 500, 1), (1, 1, 2, 1), (499, 1, 500, 1),
                                                         (100, 4, 512, 4), (7, 4, 8, 4), (1000, 8, 1024, 8)])
def test_bisect_largest_is_the_brute_force_answer_in_log_calls(threshold, good, bad, multiple) -> None:
    """The one bisection under find_max_batch_size and step_memory.largest_batch."""
    calls = []

    def fits(b: int) -> bool:
        calls.append(b)
        return b <= threshold

    want = max(b for b in range(good, bad, multiple) if fits(b))
    calls.clear()
    assert bisect_largest(fits, good, bad, multiple) == want
    assert all(b % multiple == 0 and good < b < bad for b in calls)
    assert len(calls) <= math.ceil(math.log2(max(2, (bad - good) // multiple))) + 1
