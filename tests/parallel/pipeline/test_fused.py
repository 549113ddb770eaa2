"""The fused training step (``PipelinedModel.forward_backward``): forward, loss and backward in one sweep.

References: the whole model (loss, parameter and input gradients of a model whose normalisation
is per sample), the list-scheduling simulation (``schedule.fused_step_span``) against the
threads' replayed timeline, and GPipe's two passes on the same stage costs.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import time

import pytest
import torch
from torch import nn

from gpulab.devices import logical_devices
from gpulab.parallel import PipelinedModel, measured_bubble, split_model
from gpulab.parallel.pipeline import balance as balance_mod
from gpulab.parallel.pipeline import replay
from gpulab.parallel.pipeline.balance import balanced_boundaries, interleaved_boundaries
from gpulab.parallel.pipeline.bubble import fused
from gpulab.parallel.pipeline.schedule import fused_step_span, step_span

from .models import _images, _model


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


def _targets(n: int = 8) -> torch.Tensor:
    return torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("split_size", [1, 3, 8])  # 3 does not divide 8; 8: one micro-batch
@pytest.mark.parametrize("copies", [1, 2])  # two stages, or four interleaved on devices 0, 1, 0, 1
def test_forward_backward_matches_the_whole_model(devices, copies, split_size, overlap):
    model = _model("group").train()
    whole = copy.deepcopy(model)
    split = split_model(model, devices * copies, boundaries=[5] if copies == 1 else [2, 5, 7])
    pipe = PipelinedModel(split, split_size, overlap=overlap)
    x1, x2, y = _images().requires_grad_(), _images().requires_grad_(), _targets()
    x2.grad = torch.ones_like(x2)  # forward_backward accumulates, as backward() does
    loss1 = nn.functional.cross_entropy(whole(x1), y)
    loss1.backward()
    loss2 = pipe.forward_backward(x2, y)
    assert isinstance(loss2, float) and loss2 == pytest.approx(loss1.item(), rel=1e-9)
    torch.testing.assert_close(x2.grad, x1.grad + 1)
    for (name, p1), p2 in zip(whole.named_parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, msg=lambda m, n=name: f"{n}: {m}")
    m = pipe.num_micro_batches(8)
    assert sorted((e.phase, e.stage, e.micro_batch) for e in pipe.timeline) == sorted(
        (ph, s, j) for ph in ("forward", "backward") for s in range(2 * copies) for j in range(m))
    for lane in (0, 1):  # one thread per device: a device does one thing at a time
        mine = sorted((e for e in pipe.timeline if e.worker == lane), key=lambda e: e.start)
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))


def test_without_an_input_gradient_and_with_a_custom_loss(devices):
    model = _model("group")
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devices, boundaries=[4]), 3)
    x, target = _images(), torch.randn(8, 5, dtype=torch.double)
    loss1 = nn.functional.mse_loss(whole(x), target)
    loss1.backward()
    assert pipe.forward_backward(x, target, nn.functional.mse_loss) == pytest.approx(loss1.item(), rel=1e-9)
    assert x.grad is None
    for p1, p2 in zip(whole.parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad)


class _SleepBoth(torch.autograd.Function):
    """Sleeps in forward and in backward (a sleep releases the GIL, as a kernel does)."""

    @staticmethod
    def forward(ctx, x, scale, forward_s, backward_s):
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, grad.sum(), None, None


class _Stage(nn.Module):
    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.forward_s, self.backward_s = forward_s, backward_s
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return _SleepBoth.apply(x, self.scale, self.forward_s, self.backward_s)


def test_the_threads_run_the_simulated_schedule_and_beat_two_passes(devices):
    # Device 0's stage is slow forward and quick backward, device 1's the other way: GPipe's two
    # passes each move at the slow stage's pace; in one sweep each device's two kinds of work
    # share its time. The replay keeps the threads' order and drops the hand-offs: its span is the
    # simulation's, and shorter than GPipe's.
    forward, backward, micro = [0.03, 0.01], [0.01, 0.03], 4
    pipe = PipelinedModel(split_model([_Stage(f, b) for f, b in zip(forward, backward)], devices), 1)
    pipe.forward_backward(torch.ones(micro, 1), torch.zeros(micro, 1), nn.functional.mse_loss)
    assert fused(pipe.timeline)
    replayed = replay(pipe.timeline)
    span = max(e.end for e in replayed) - min(e.start for e in replayed)
    # the simulation on the durations as measured (a sleep overshoots by a fraction of a ms)
    measured = {ph: [statistics.mean(e.duration for e in pipe.timeline if (e.phase, e.stage) == (ph, s))
                     for s in (0, 1)] for ph in ("forward", "backward")}
    assert span == pytest.approx(fused_step_span(measured["forward"], measured["backward"], [0, 1], micro), rel=0.03)
    assert fused_step_span(forward, backward, [0, 1], micro) < 0.85 * step_span(forward, backward, [0, 1], micro)
    # the bubble of a fused step is over its whole span, not over each phase apart
    busy = sum(e.duration for e in replayed)
    assert measured_bubble(replayed) == pytest.approx(1 - busy / (2 * span), abs=1e-9)


def test_a_gpipe_timeline_is_not_fused(devices):
    pipe = PipelinedModel(split_model([_Stage(0.001, 0.001), _Stage(0.001, 0.001)], devices), 1)
    nn.functional.mse_loss(pipe(torch.ones(3, 1)), torch.zeros(3, 1)).backward()
    assert not fused(pipe.timeline)


def test_bad_targets_and_a_non_leaf_input_say_what_to_do(devices):
    pipe = PipelinedModel(split_model(_model("group"), devices, boundaries=[4]), 4)
    with pytest.raises(ValueError, match="one row per input row"):
        pipe.forward_backward(_images(), _targets(7))
    x = _images().requires_grad_() * 2
    with pytest.raises(ValueError, match=r"loss_fn\(pipe\(x\), targets\).backward\(\)"):
        pipe.forward_backward(x, _targets())
    assert all(p.grad is None for p in pipe.parameters())  # nothing ran


def test_a_failing_loss_stops_every_thread_with_its_note(devices):
    calls = []

    def loss_fn(out, target):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom in the loss")
        return nn.functional.mse_loss(out, target)

    pipe = PipelinedModel(split_model([nn.Linear(1, 1), nn.Linear(1, 1)] * 2, devices * 2), 1)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="boom in the loss") as info:
        pipe.forward_backward(torch.ones(4, 1), torch.zeros(4, 1), loss_fn)
    assert time.monotonic() - start < 10
    assert any("pipeline stage 3" in note and "micro-batch 1" in note and "forward" in note
               for note in info.value.__notes__)


def test_the_fused_cut_is_the_shortest_simulated_fused_step():
    # per-pass costs that no cut balances in both passes, but whose sums balance
    forward = [4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 1.0]
    backward = [1.0, 2.0, 2.0, 1.0, 3.0, 1.0, 1.0, 4.0]
    lanes = [0, 1, 0, 1]

    def costs(cut):
        edges = list(zip((0, *cut), (*cut, len(forward))))
        return [sum(forward[a:b]) for a, b in edges], [sum(backward[a:b]) for a, b in edges]

    def total(span, cut, lanes=lanes):
        return sum(span(*costs(cut), lanes, m) / m for m in (2, 4, 8))

    chosen = tuple(interleaved_boundaries(forward, backward, lanes, fused=True))
    every = list(itertools.combinations(range(1, len(forward)), 3))
    assert total(fused_step_span, chosen) == pytest.approx(min(total(fused_step_span, c) for c in every))
    gpipe = tuple(interleaved_boundaries(forward, backward, lanes))
    assert total(fused_step_span, chosen) <= total(fused_step_span, gpipe)
    # two stages, one per device: the simulation serves too
    two = interleaved_boundaries(forward, backward, [0, 1], fused=True)
    assert total(fused_step_span, tuple(two), [0, 1]) == pytest.approx(
        min(total(fused_step_span, (c,), [0, 1]) for c in range(1, 8)))


def test_past_the_simulation_limit_the_fused_cut_balances_the_sums(monkeypatch):
    forward, backward = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [6.0, 5.0, 1.0, 1.0, 1.0, 1.0]
    monkeypatch.setattr(balance_mod, "MAX_SIMULATED_CUTS", 1)
    sums = [f + b for f, b in zip(forward, backward)]
    assert interleaved_boundaries(forward, backward, [0, 1, 0, 1], fused=True) == balanced_boundaries(sums, 4)


def test_the_simulated_fused_step_with_equal_stages_is_as_long_as_two_passes():
    for lanes in ([0, 1], [0, 1, 0, 1]):
        for micro in (2, 3, 4, 8):
            f, b = [1.0] * len(lanes), [2.0] * len(lanes)
            assert fused_step_span(f, b, lanes, micro) == pytest.approx(step_span(f, b, lanes, micro))
    with pytest.raises(ValueError, match="one forward and one backward cost per stage"):
        fused_step_span([1.0], [1.0, 2.0], [0], 2)
