"""gpulab.profiling.bottleneck: the busy fraction against a brute-force reference, the classification
rules, and the verdict's advice."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.profiling import bottleneck


def _grid_busy(intervals, start, end, n=4000):
    """A brute-force reference: sample the window at n points."""
    step = (end - start) / n
    hits = sum(any(b <= start + (k + 0.5) * step < f for b, f in intervals) for k in range(n))
    return hits / n


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-1, 11), st.floats(0, 4)), max_size=8))
def test_busy_fraction_matches_a_brute_force_reference(raw) -> None:
    intervals = [(b, b + d) for b, d in raw]
    assert bottleneck.busy_fraction(intervals, 0.0, 10.0) == pytest.approx(_grid_busy(intervals, 0.0, 10.0), abs=0.01)


def test_busy_fraction_bad_input() -> None:
    with pytest.raises(ValueError, match="end > start"):
        bottleneck.busy_fraction([], 1.0, 1.0)
    with pytest.raises(ValueError, match="ends before it begins"):
        bottleneck.busy_fraction([(2.0, 1.0)], 0.0, 3.0)


def test_classify_rules() -> None:
    assert bottleneck.classify(0.9, {"data": 0.9}) == "compute"
    assert bottleneck.classify(0.3, {"data": 0.6, "sync": 0.2}) == "data"
    assert bottleneck.classify(0.6, {"data": 0.3, "sync": 0.6}) == "sync"
    assert bottleneck.classify(0.2, {"copy": 0.5, "data": 0.4}) == "copy"
    assert bottleneck.classify(0.1, {"host": 0.7}) == "host"


def test_verdict_advice_follows_workers_and_cores() -> None:
    v = bottleneck.verdict(0.35, {"data": 0.63}, num_workers=0, cpu_count=16)
    assert v.startswith("data-bound: 63 % of each step waits for the next batch") and v.endswith("num_workers=0 on 16 cores, try 4-8")
    assert bottleneck.suggested_workers(2) == (1, 2) and bottleneck.suggested_workers(8) == (2, 4)
    assert "try 3-4" in bottleneck.workers_advice(2, 8)
    assert "try 2 with persistent" in bottleneck.workers_advice(1, 2)  # a range of one is one number
    assert "already uses all 2 cores" in bottleneck.workers_advice(2, 2)
    assert "1 core" in bottleneck.workers_advice(0, 1)
    assert "not a torch DataLoader" in bottleneck.workers_advice(None, 4)
