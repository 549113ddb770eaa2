"""gpulab.parallel.measure.ring_cost: the fit recovers known α and β, the step model agrees with
hand-computed timelines, and the instruments measure what they say."""

from __future__ import annotations

import math
import random

import pytest
import torch

from gpulab.parallel import launch
from gpulab.parallel.ddp.bucketed import bucket_assignment
from gpulab.parallel.measure.ring_cost import (
    allreduce_seconds,
    backward_seconds,
    best_bucket_size,
    fit_alpha_beta,
    predict_sync_seconds,
    ring_allreduce_seconds,
)


def test_ring_formula_counts_2_n_minus_1_steps_and_2_n_minus_1_over_n_of_the_bytes():
    assert ring_allreduce_seconds(0, 4, 1e-4, 1e-9) == pytest.approx(6e-4)
    assert ring_allreduce_seconds(1e6, 4, 0, 1e-9) == pytest.approx(1.5e-3)   # 2 * 3/4 of 1 MB at 1 GB/s
    assert ring_allreduce_seconds(1e6, 2, 0, 1e-9) == pytest.approx(1e-3)


def test_fit_recovers_alpha_and_beta_and_minimises_relative_errors():
    sizes = [1e3, 1e4, 1e5, 1e6, 4e6]
    for n in (2, 3, 8):
        times = [ring_allreduce_seconds(b, n, 5e-5, 2e-10) for b in sizes]
        alpha, beta = fit_alpha_beta(sizes, times, n)
        assert alpha == pytest.approx(5e-5, rel=1e-9) and beta == pytest.approx(2e-10, rel=1e-9)
    rng = random.Random(0)
    noisy = [ring_allreduce_seconds(b, 2, 5e-5, 2e-10) * (1 + 0.2 * rng.uniform(-1, 1)) for b in sizes]
    alpha, beta = fit_alpha_beta(sizes, noisy, 2)
    # the least-squares solution in relative errors: moving either parameter a little only makes it worse
    def loss(a, b):
        return sum(((ring_allreduce_seconds(s, 2, a, b) - t) / t) ** 2 for s, t in zip(sizes, noisy))
    best = loss(alpha, beta)
    for da, db in ((1e-7, 0), (-1e-7, 0), (0, 1e-12), (0, -1e-12)):
        assert loss(alpha + da, beta + db) > best
    # the smallest sizes count as much as the largest: alpha stays positive and near the truth
    assert 2.5e-5 < alpha < 1e-4


def test_fit_refuses_data_it_cannot_fit():
    with pytest.raises(ValueError, match="distinct"):
        fit_alpha_beta([8, 8], [1.0, 1.0], 2)
    with pytest.raises(ValueError, match="one time per size"):
        fit_alpha_beta([8, 16], [1.0], 2)
    with pytest.raises(ValueError, match="world_size"):
        fit_alpha_beta([8, 16], [1.0, 2.0], 1)
    with pytest.raises(ValueError, match="> 0"):
        fit_alpha_beta([8, 16], [1.0, 0.0], 2)


def _params(*numels):
    return [torch.empty(n, device="meta") for n in numels]


def test_prediction_with_overlap_follows_the_hand_drawn_timeline():
    params = _params(250_000, 250_000, 250_000, 250_000)   # four 1 MB gradients, ready at 1, 2, 3, 4 s
    alpha, beta = 0.1, 1e-6                                  # on 2 ranks: 0.2 s + 1 s per MB
    # one bucket per gradient: each ends 1.2 s after the later of its readiness and the previous end
    assert predict_sync_seconds(params, 4.0, 0.96, 2, alpha, beta) == pytest.approx(1 + 4 * 1.2)
    # two gradients per bucket: ready at 2 and 4 s, 2.2 s each -> 4.2, then 6.4
    assert predict_sync_seconds(params, 4.0, 1.91, 2, alpha, beta) == pytest.approx(6.4)
    # one bucket: everything after backward
    assert predict_sync_seconds(params, 4.0, 100, 2, alpha, beta) == pytest.approx(4 + 0.2 + 4)


def test_prediction_without_overlap_adds_every_all_reduce_after_backward():
    params = _params(*[1000] * 10)
    for mb in (0.001, 0.01, 1):
        calls = len(bucket_assignment(params, mb))
        expected = 0.5 + calls * 2 * 1e-3 + 40_000 * 1e-8
        assert predict_sync_seconds(params, 0.5, mb, 2, 1e-3, 1e-8, overlap=False) == pytest.approx(expected)


def test_best_bucket_size_trades_calls_against_overlap():
    params = _params(*[250_000] * 8)   # 8 MB in 1 MB gradients
    candidates = [0.5, 2.0, 100.0]
    # latency-bound: fewest calls wins; bandwidth-bound with overlap: small buckets hide the transfer
    assert best_bucket_size(params, 1.0, candidates, 2, 1.0, 1e-12) == 100.0
    assert best_bucket_size(params, 8.0, candidates, 2, 1e-6, 1e-6) == 0.5
    # without overlap nothing hides, so the fewest calls always win
    assert best_bucket_size(params, 8.0, candidates, 2, 1e-6, 1e-6, overlap=False) == 100.0
    with pytest.raises(ValueError, match="candidate"):
        best_bucket_size(params, 1.0, [], 2, 1.0, 1.0)


def test_allreduce_seconds_grows_with_the_size():
    small, large = launch(allreduce_seconds, 2, args=([4096, 32 * 2**20], 5), echo=False)[0]
    assert 0 < small < large and math.isfinite(large)


def test_backward_seconds_leaves_nothing_behind_and_is_positive():
    model = torch.nn.Linear(16, 4)
    t = backward_seconds(model, torch.randn(8, 16), torch.randint(0, 4, (8,)), repeats=2)
    assert t > 0


@pytest.mark.multigpu
def test_allreduce_seconds_runs_under_nccl_on_the_ranks_gpus():
    """Under NCCL the buffer is on each rank's GPU (NCCL has no CPU tensors) and the time is the
    all-reduce's, synchronised, not its enqueue."""
    small, large = launch(allreduce_seconds, 2, args=([4096, 32 * 2**20], 5), backend="nccl", echo=False)[0]
    assert 0 < small < large
