"""gpulab.memory.origins: views and in-place results are not new tensors, and tracing is bounded."""

from __future__ import annotations

import torch

from gpulab.memory import LeakFinder


def test_views_and_in_place_results_are_not_new_tensors() -> None:
    with LeakFinder() as finder:
        x = torch.empty(100)
        finder.step()
        views = [x.view(10, 10), x[3:], x.t()]
        x.add_(1)
        finder.step()
        finder.step()
    survivors = finder.survivors()
    assert [(s.shape, s.nbytes, s.step) for s in survivors] == [((100,), 400, 0)]
    del views


def test_tracing_is_bounded() -> None:
    keep = []
    with LeakFinder(max_records=5) as finder:
        for _ in range(3):
            keep.extend(torch.empty(10) for _ in range(4))
            finder.step()
    assert len(finder._tracer.records) == 5 and finder._tracer.dropped == 7
    assert "not traced" in str(finder.report())
