"""gpulab.parallel.dp.step_memory: per-device memory of one step (the labs' imbalance figures), the
budget check, and the largest-batch search against brute force."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.devices import logical_devices
from gpulab.parallel import DataParallel, DataParallelCriterion, DataParallelModel
from gpulab.parallel.dp.step_memory import HeadWorkload, fits_in_budget, largest_batch, step_memory

MiB = 2**20


@pytest.fixture(scope="module")
def lab():
    w = HeadWorkload()
    return w, logical_devices(w.num_devices, physical=["cpu"]), w.model()


def test_the_labs_workload_is_unbalanced_until_the_loss_is_parallel(lab) -> None:
    """The thresholds labs 04-05 grade: DataParallel >= 2, balanced criterion <= 1.25."""
    w, devs, head = lab
    x, y = w.batch()
    plain = step_memory(DataParallel(head, devs), F.cross_entropy, x, y, devs)
    moved = step_memory(DataParallel(head, devs, output_device=devs[1]), F.cross_entropy, x, y, devs)
    balanced = step_memory(DataParallelModel(head, devs), DataParallelCriterion(F.cross_entropy, devs), x, y, devs)
    peaks = [r.peak for r in plain.rows]
    assert plain.imbalance >= 2 and peaks[0] == max(peaks)
    logits = w.batch_size * w.vocab * 4
    assert peaks[0] - peaks[1] > 2 * logits  # the gathered logits and the loss's temporaries
    moved_peaks = [r.peak for r in moved.rows]
    assert moved_peaks[1] == max(moved_peaks) and moved.imbalance >= 2  # moved, not removed
    assert balanced.imbalance <= 1.25
    assert max(r.peak for r in balanced.rows) < peaks[0] / 2
    assert all(p.grad is None for p in head.parameters())  # measurements leave no gradients


def test_fits_in_budget_around_the_measured_peak(lab) -> None:
    w, devs, head = lab
    x, y = w.batch(64)
    model = DataParallel(head, devs)
    peak = max(r.peak for r in step_memory(model, F.cross_entropy, x, y, devs).rows)
    assert fits_in_budget(model, F.cross_entropy, x, y, devs, budget=peak)
    assert not fits_in_budget(model, F.cross_entropy, x, y, devs, budget=peak - 1)
    assert all(p.grad is None for p in head.parameters())  # cleaned up after running out, too
    with pytest.raises(torch.OutOfMemoryError, match="MemoryMeter out of memory"):
        step_memory(DataParallelModel(head, devs), DataParallelCriterion(F.cross_entropy, devs), x, y, devs,
                    budget=8 * MiB)  # below the parameters' copies: fails in a replica thread


@settings(max_examples=200, deadline=None)
@given(threshold=st.integers(0, 5000), multiple=st.sampled_from([1, 4, 8]), limit=st.integers(8, 6000))
def test_largest_batch_matches_brute_force_in_few_probes(threshold, multiple, limit) -> None:
    probes = []

    def fits(b):
        probes.append(b)
        return b <= threshold

    got = largest_batch(fits, multiple=multiple, limit=limit)
    want = max((b for b in range(multiple, limit + 1, multiple) if b <= threshold), default=0)
    assert got == want
    assert all(b % multiple == 0 and 0 < b <= limit for b in probes)
    assert len(probes) <= 2 * math.log2(limit / multiple + 1) + 3


def test_largest_batch_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="multiple"):
        largest_batch(lambda b: True, multiple=0)
    with pytest.raises(ValueError, match="limit=2 is below multiple=4"):
        largest_batch(lambda b: True, multiple=4, limit=2)
