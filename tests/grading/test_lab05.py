"""gpulab.grading.lab05: the seeded cases the hidden tests run give gpulab's references the right
answers, and tell a wrong submission from a right one (an unweighted average of the device losses,
a linear search, a warmup that ignores a shrinking batch)."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from gpulab import grading
from gpulab.evidence.codec import encode
from gpulab.grading import lab05
from gpulab.parallel import comm, parallel_apply
from gpulab.verdict.check import decode, verdict


def _close(actual, expected, **tol) -> str | None:
    return verdict({"kind": "close", "what": "x", **tol}, decode(encode(actual)), decode(encode(expected)))


def _unweighted(outputs, targets, loss_fn, devices):
    """parallel_loss with a plain average of the device losses: right only for even splits."""
    rows = [o.shape[0] for o in outputs]
    used = devices[:len(outputs)]
    pieces = [comm.to(t, d) for t, d in zip(targets.split(rows), used)]
    losses = parallel_apply([loss_fn] * len(outputs), list(zip(outputs, pieces)), used)
    return sum(comm.to(loss, devices[0]) for loss in losses) / len(losses)


def test_parallel_step_with_gpulabs_criterion_equals_one_device() -> None:
    for rows in (1, 3, 7, 8, 13):
        assert _close(lab05.parallel_step(lab05.gpulab_parallel_loss, rows, rows), lab05.single_step(rows, rows)) is None


def test_an_unweighted_average_fails_on_uneven_splits_only() -> None:
    assert _close(lab05.parallel_step(_unweighted, 8, 1), lab05.single_step(8, 1)) is None
    assert _close(lab05.parallel_step(_unweighted, 7, 1), lab05.single_step(7, 1)) is not None


def test_wide_outputs_are_seeded_and_split_over_the_devices() -> None:
    outs, y, devices = lab05.wide_outputs(5, 14, 100)
    again, y2, _ = lab05.wide_outputs(5, 14, 100)
    assert [o.shape[0] for o in outs] == [4, 4, 4, 2] and len(devices) == 4
    assert all(torch.equal(a, b) for a, b in zip(outs, again)) and torch.equal(y, y2)
    loss = lab05.gpulab_parallel_loss(outs, y, F.cross_entropy, devices)
    assert torch.allclose(loss, F.cross_entropy(torch.cat([o.detach() for o in outs]), y))


def test_the_reference_search_finds_the_analytic_answer_in_few_probes() -> None:
    cases = lab05.largest_batch_cases(random.Random(3), 300)
    answers, stray, excess = lab05.search(lambda f, m, lim: lab05.largest_batch(f, multiple=m, limit=lim), cases)
    want = {f"threshold={t}, multiple={m}, limit={lim}": min(t, lim) // m * m for t, m, lim in cases}
    assert answers == want and stray == [] and excess <= 0
    assert lab05.reference_search(cases) == (answers, [])
    assert {a == 0 for a in answers.values()} == {True, False}  # both kinds of case are drawn


def test_a_linear_search_is_right_but_too_slow() -> None:
    def linear(fits, multiple, limit):
        b = 0
        while b + multiple <= limit and fits(b + multiple):
            b += multiple
        return b

    cases = lab05.largest_batch_cases(random.Random(4), 50)
    answers, stray, excess = lab05.search(linear, cases)
    assert answers == lab05.reference_search(cases)[0] and stray == [] and excess > 0


def test_lr_cases_cover_the_warmup_and_the_reference_follows_the_rule() -> None:
    cases = lab05.lr_cases(random.Random(5), 400)
    table = lab05.lr_table(lab05.scaled_lr, cases)

    def rule(step, base_lr, base_batch, batch, warmup):
        target = base_lr * batch / base_batch
        if step >= warmup or batch <= base_batch:
            return target
        return base_lr + (target - base_lr) * step / warmup

    assert _close(table, {f"scaled_lr{a}": rule(*a) for a in cases}, rtol=1e-6, atol=1e-12) is None
    assert any(0 < a[0] < a[4] and a[3] > a[2] for a in cases)  # steps inside a warmup that ramps

    def no_shrink_rule(step, base_lr, base_batch, batch, warmup=0):  # warms up towards a smaller rate too
        target = base_lr * batch / base_batch
        return target if step >= warmup else base_lr + (target - base_lr) * step / warmup

    assert _close(lab05.lr_table(no_shrink_rule, cases), table, rtol=1e-6, atol=1e-12) is not None


def test_seeded_inputs_change_with_the_seed(monkeypatch) -> None:
    monkeypatch.setenv("GPULAB_SEED", "11")
    first = lab05.largest_batch_cases(grading.rng("largest_batch"), 20)
    monkeypatch.setenv("GPULAB_SEED", "12")
    assert lab05.largest_batch_cases(grading.rng("largest_batch"), 20) != first
