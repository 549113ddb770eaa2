"""gpulab.memory.fixes.savings: peak_memory against analytic bytes; bf16 autocast and checkpointing
lower the metered peak of the lab's workloads, checkpointing with exactly the same results."""

from __future__ import annotations

import copy

import pytest
import torch

from gpulab.memory.fixes.savings import (
    bf16_step,
    checkpointed_forward,
    checkpointed_step,
    fp32_step,
    lab_workloads,
    peak_memory,
    segment_sizes,
)


def test_peak_memory_is_what_the_call_adds() -> None:
    def work():
        a = torch.empty(1000)
        b = torch.empty(2000)
        del a, b
        torch.empty(500)

    assert peak_memory(work) == 3000 * 4
    model = torch.nn.Linear(10, 10)
    assert peak_memory(lambda: torch.empty(10), track=model) == 40  # the model is the baseline


def _workloads():
    return [(w.model, w.blocks, w.inputs, w.targets, w.loss_fn) for w in lab_workloads().values()]


def test_bf16_autocast_lowers_the_metered_peak_on_cpu_too() -> None:
    for model, _, x, y, loss_fn in _workloads():
        model.zero_grad(set_to_none=True)
        fp32 = peak_memory(fp32_step, model, x, y, loss_fn, track=model)
        model.zero_grad(set_to_none=True)
        bf16 = peak_memory(bf16_step, model, x, y, loss_fn, track=model)
        assert 0.5 < bf16 / fp32 < 0.7, (type(model).__name__, bf16 / fp32)  # benchmark: 0.60 and 0.63
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_checkpointing_gives_the_same_results_with_less_memory() -> None:
    ratios = []
    for model, blocks, x, y, loss_fn in _workloads():
        plain = copy.deepcopy(model)
        out = checkpointed_forward(blocks, x)
        torch.testing.assert_close(out, plain(x), rtol=0, atol=0)
        loss_fn(out, y).backward()
        loss_fn(plain(x), y).backward()
        for p, q in zip(model.parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
        model.zero_grad(set_to_none=True)
        fp32 = peak_memory(fp32_step, model, x, y, loss_fn, track=model)
        model.zero_grad(set_to_none=True)
        ratios.append(peak_memory(checkpointed_step, blocks, x, y, loss_fn, track=model) / fp32)
    assert ratios[0] < 0.9 and ratios[1] < 0.55, ratios  # benchmark: 0.79 (CNN), 0.44 (transformer)


def test_segment_sizes_split_as_equally_as_possible_and_refuse_bad_counts() -> None:
    assert segment_sizes(5, 2) == [3, 2] and segment_sizes(5, 4) == [2, 1, 1, 1] and segment_sizes(4, 4) == [1] * 4
    assert segment_sizes(5, 1) == [5]
    for bad in (0, 6, 2.0, True):
        with pytest.raises(ValueError, match="segments must be an int from 1"):
            segment_sizes(5, bad)


def test_more_segments_lower_the_peak_with_the_same_results() -> None:
    w = lab_workloads()["transformer"]  # 4 encoder layers and a classifier: 5 blocks
    plain = copy.deepcopy(w.model)
    ref = plain(w.inputs)
    w.loss_fn(ref, w.targets).backward()
    peaks = []
    for k in range(1, 6):
        w.model.zero_grad(set_to_none=True)
        out = checkpointed_forward(w.blocks, w.inputs, k)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        w.loss_fn(out, w.targets).backward()
        for p, q in zip(w.model.parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
        w.model.zero_grad(set_to_none=True)
        peaks.append(peak_memory(lambda: w.loss_fn(checkpointed_forward(w.blocks, w.inputs, k), w.targets).backward(),
                                 track=w.model))
    w.model.zero_grad(set_to_none=True)
    fp32 = peak_memory(fp32_step, w.model, w.inputs, w.targets, w.loss_fn, track=w.model)
    ratios = [p / fp32 for p in peaks]
    assert ratios[0] == pytest.approx(1.0, abs=0.02)  # one run, not checkpointed: the plain peak
    assert all(b <= a for a, b in zip(ratios, ratios[1:])) and ratios[1] < 0.9 and ratios[-1] < 0.5, ratios
