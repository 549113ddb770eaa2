"""gpulab.grading.lab06_cost: the cases are drawn from the grading run's seed and exercise what they
claim, the measured inputs are sane, and torch's bucket rule is refused only inside the block."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from gpulab.grading import lab06
from gpulab.parallel.ddp.rebuild import ready_order, rebuilt_buckets
from gpulab.parallel.measure.ring_cost import ring_allreduce_seconds


def test_cases_are_the_same_for_the_same_seed_and_differ_for_another():
    for make in (lab06.alpha_beta_cases, lab06.prediction_cases, lab06.best_size_cases, lab06.rebuild_cases):
        assert list(make(random.Random("a"))) == list(make(random.Random("a")))
        assert list(make(random.Random("a"))) != list(make(random.Random("b")))


def test_fit_cases_are_fittable_and_prediction_cases_cover_both_regimes():
    for sizes, times, n in lab06.alpha_beta_cases(random.Random(1)).values():
        alpha, beta = lab06.fit_alpha_beta(sizes, times, n)
        errors = [(ring_allreduce_seconds(b, n, alpha, beta) - t) / t for b, t in zip(sizes, times)]
        # the times are a true alpha and beta with at most 20 % noise: the best fit does at least as well
        assert sum(e * e for e in errors) <= len(sizes) * 0.2 ** 2 / (1 - 0.2) ** 2
    regimes = {c[-1] for c in lab06.prediction_cases(random.Random(1)).values()}
    assert regimes == {True, False}


def test_rebuild_models_have_a_ready_order_that_is_not_the_reverse_registration_order():
    for model, x, y, mb, first in lab06.rebuild_models(random.Random(2)).values():
        params = list(model.parameters())
        order = ready_order(model, x, y)
        assert sorted(order) != order and order != list(reversed(range(len(params))))
        assert len(rebuilt_buckets(params, order, mb, first)) > 1


def test_torchs_rule_is_refused_inside_the_block_only():
    params = [torch.empty(10)]
    with lab06.refusing_torch_bucket_rule():
        with pytest.raises(RuntimeError, match="write the bucket rule yourself"):
            dist._compute_bucket_assignment_by_size(params, [100])
    assert dist._compute_bucket_assignment_by_size(params, [100])[0] == [[0]]


def test_measured_inputs_of_the_timed_check():
    sizes, seconds, n = lab06.measured_alpha_beta(repeats=3)
    assert n == 2 and len(sizes) == len(seconds) and all(t > 0 for t in seconds)
    params, backward_s = lab06.timed_model()
    assert len(params) == 2 * (lab06.SPEED_CFG.depth + 1) and backward_s > 0
    assert [p.shape for p in lab06.timed_params()] == [p.shape for p in params]
    chosen = lab06.best_bucket_size(params, backward_s, list(lab06.CANDIDATES_MB), 2, 1e-4, 1e-9, False)
    assert chosen == max(lab06.CANDIDATES_MB)  # without overlap the fewest calls win
