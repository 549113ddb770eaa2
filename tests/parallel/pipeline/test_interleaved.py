"""Interleaved stages: a split whose devices repeat (stages on devices 0, 1, 0, 1), one thread per device.

References: the whole model (gradients of a model whose normalisation is per sample), the bubble
formula of the interleaved schedule (Narayanan et al. 2021) against a replay of the recorded
timeline, and the order of work on one device read off the timeline (earliest stage first).
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn

from gpulab.devices import logical_devices
from gpulab.devices.validate import check_devices
from gpulab.parallel import PipelinedModel, bubble_fraction, measured_bubble, split_model
from gpulab.parallel.pipeline import replay
from gpulab.parallel.pipeline.bubble import plot_timeline
from gpulab.parallel.pipeline.split import device_lanes

from .models import _images, _model


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


@pytest.mark.parametrize("split_size", [1, 3, 8])  # 3 does not divide 8; 8: one micro-batch
def test_interleaved_gradients_match_the_whole_model(devices, split_size):
    model = _model("group").train()
    whole = copy.deepcopy(model)
    split = split_model(model, devices * 2, boundaries=[2, 5, 7])  # stages on devices 0, 1, 0, 1
    assert split.devices == [devices[0], devices[1], devices[0], devices[1]]
    pipe = PipelinedModel(split, split_size)
    x1, x2 = _images().requires_grad_(), _images().requires_grad_()
    out1, out2 = whole(x1), pipe(x2)
    torch.testing.assert_close(out2, out1)
    out1.square().mean().backward()
    out2.square().mean().backward()
    torch.testing.assert_close(x2.grad, x1.grad)
    for (name, p1), p2 in zip(whole.named_parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, msg=lambda m, n=name: f"{n}: {m}")
    m = pipe.num_micro_batches(8)
    assert sorted((e.phase, e.stage, e.micro_batch) for e in pipe.timeline) == sorted(
        (ph, s, j) for ph in ("forward", "backward") for s in range(4) for j in range(m))
    # one thread per device: each stage's work is on its device's lane, and a lane does one thing at a time
    assert {(e.stage, e.lane) for e in pipe.timeline} == {(0, 0), (1, 1), (2, 0), (3, 1)}
    for lane in (0, 1):
        for phase in ("forward", "backward"):
            mine = sorted((e for e in pipe.timeline if e.lane == lane and e.phase == phase), key=lambda e: e.start)
            assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
    assert "interleaved on 2 devices" in pipe.mode


class _Sleep(nn.Module):
    """Forward takes ``seconds`` (a sleep releases the GIL, as a kernel does); backward is free."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        time.sleep(self.seconds)
        return x * self.scale


def _sleepy_pipe(devices, seconds, split_size=1):
    layers = [_Sleep(s) for s in seconds]
    return PipelinedModel(split_model(layers, devices * (len(seconds) // len(devices))), split_size)


@pytest.mark.parametrize("micro", [2, 3, 4, 5, 6])
def test_the_interleaved_bubble_is_the_formula(devices, micro):
    # Four equal stages on two devices: fill and drain take one small stage, (S - 1) / (v M + S - 1),
    # against (S - 1) / (M + S - 1) with two stages of twice the work. The replay keeps the order the
    # threads chose and drops what the hand-offs cost, so only the order is tested. (Running the
    # deepest ready work first instead missed the formula at M = 3 and 5, and at M = 4 whenever
    # two equal stages ended at the same moment.)
    pipe = _sleepy_pipe(devices, [0.02] * 4)
    with torch.no_grad():
        pipe(torch.ones(micro, 1))
    expected = bubble_fraction(2, micro, chunks_per_device=2)
    assert expected < bubble_fraction(2, micro)
    assert measured_bubble(replay(pipe.timeline)) == pytest.approx(expected, abs=0.03)


def test_a_device_runs_its_earliest_stage_first(devices):
    # Stage 0 takes 50 ms per micro-batch, the others 1 ms: stage 2's micro-batch 0 reaches device 0
    # about 50 ms before stage 0 is done with the batch, and still waits for it (breadth-first). In
    # the backward pass the last stage comes first: device 1 runs stage 3 for every micro-batch, then 1.
    pipe = _sleepy_pipe(devices, [0.05, 0.001, 0.001, 0.001])
    x = torch.ones(4, 1, requires_grad=True)
    pipe(x).sum().backward()

    def order(lane, phase):
        return [(e.stage, e.micro_batch) for e in sorted(pipe.timeline, key=lambda e: e.start)
                if e.lane == lane and e.phase == phase]

    assert order(0, "forward") == [(0, j) for j in range(4)] + [(2, j) for j in range(4)]
    assert order(1, "backward") == [(3, j) for j in range(4)] + [(1, j) for j in range(4)]
    assert x.grad is not None


class _Fail(nn.Module):
    def __init__(self, at_call: int) -> None:
        super().__init__()
        self.at_call, self.calls = at_call, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > self.at_call:
            raise ValueError("boom in a shared device's second stage")
        return x + 1


def test_a_failing_stage_on_a_shared_device_stops_every_thread_with_its_note(devices):
    pipe = PipelinedModel(split_model([nn.Identity(), nn.Identity(), _Fail(1), nn.Identity()], devices * 2), 1)
    start = time.monotonic()
    with pytest.raises(ValueError, match="boom") as info:
        with torch.no_grad():
            pipe(torch.ones(4, 1))
    assert time.monotonic() - start < 10  # nobody waited for work that never came
    assert any("pipeline stage 2" in note and "micro-batch 1" in note for note in info.value.__notes__)


def test_only_a_split_lets_a_device_come_back(devices):
    with pytest.raises(ValueError, match="twice"):
        check_devices(devices * 2)
    assert check_devices(devices * 2, repeats=True) == devices * 2
    assert device_lanes(devices * 2) == [0, 1, 0, 1] and device_lanes(devices[::-1] + devices[1:]) == [0, 1, 0]
    split = split_model(_model("group"), devices * 2, boundaries=[2, 5, 7])
    assert [line.rsplit(" on ", 1)[1].split()[0] for line in split.describe().splitlines()] == [
        "logical:0", "logical:1", "logical:0", "logical:1"]


def test_bubble_fraction_of_interleaved_stages():
    assert bubble_fraction(2, 4, chunks_per_device=2) == pytest.approx(1 / 9)
    assert bubble_fraction(4, 8, chunks_per_device=3) == pytest.approx(3 / 27)
    assert bubble_fraction(2, 4, 1) == bubble_fraction(2, 4)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="chunks_per_device"):
            bubble_fraction(2, 4, chunks_per_device=bad)


def test_the_timeline_plot_has_a_row_per_device(devices):
    pipe = _sleepy_pipe(devices, [0.001] * 4)
    with torch.no_grad():
        pipe(torch.ones(3, 1))
    ax = plot_timeline(pipe.timeline)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["device 0 (stages 0, 2)", "device 1 (stages 1, 3)"]
    import matplotlib.pyplot as plt
    plt.close(ax.figure)
