"""gpulab.parallel.pipeline.gpipe: GPipe's training step against the whole model's step.

References: the unsplit model's loss and gradients (GroupNorm, so micro-batches change nothing),
GPipe's order read off the timeline (each stage's forwards before its backwards, each hand-off
after the work it hands on), and a barrier only two stages working at once can pass.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from gpulab.devices import logical_devices
from gpulab.parallel import split_model
from gpulab.parallel.pipeline import gpipe_train_step

from .models import _images, _model


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


@pytest.mark.parametrize("split_size", [3, 8])
def test_gpipe_train_step_is_a_training_step_of_the_whole_model(devices, split_size):
    model = _model("group")
    whole = copy.deepcopy(model)
    split = split_model(model, devices, boundaries=[4])
    x, y = _images(), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    expected = nn.functional.cross_entropy(whole(x), y)
    expected.backward()
    timeline = []
    loss = gpipe_train_step(list(split.stages), split.devices, x, y, split_size, timeline=timeline)
    assert loss == pytest.approx(expected.item())
    for (name, p1), p2 in zip(whole.named_parameters(), split.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, msg=lambda m, n=name: f"{n}: {m}")
    m = -(-8 // split_size)
    assert sorted((e.phase, e.stage, e.micro_batch) for e in timeline) == sorted(
        (ph, s, j) for ph in ("forward", "backward") for s in range(2) for j in range(m))
    gpipe_train_step(list(split.stages), split.devices, x, y, split_size)  # accumulates, as .backward() does
    for p1, p2 in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(p2.grad, 2 * p1.grad)


def test_the_timeline_follows_gpipes_schedule(devices):
    split = split_model(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), devices, boundaries=[2])
    timeline = []
    gpipe_train_step(list(split.stages), split.devices, torch.randn(10, 3), torch.randn(10, 2), 3,
                     nn.functional.mse_loss, timeline)
    event = {(e.phase, e.stage, e.micro_batch): e for e in timeline}
    assert len(event) == len(timeline) == 2 * 2 * 4
    for s in range(2):  # every forward of a stage before any of its backwards
        assert max(event["forward", s, j].end for j in range(4)) <= min(event["backward", s, j].start for j in range(4))
    for j in range(4):  # a stage starts a micro-batch once the stage it depends on has finished it
        assert event["forward", 1, j].start >= event["forward", 0, j].end
        assert event["backward", 0, j].start >= event["backward", 1, j].end


class _Meet(nn.Module):
    """Identity that waits at a barrier on one micro-batch: two stages pass only if they run at once."""

    def __init__(self, barrier: threading.Barrier, rows: float) -> None:
        super().__init__()
        self.barrier, self.rows, self.w = barrier, rows, nn.Parameter(torch.ones(()))

    def forward(self, x):
        if x[0, 0].item() == self.rows:
            self.barrier.wait(timeout=10)
        return x * self.w


def test_the_stages_work_at_the_same_time(devices):
    barrier = threading.Barrier(2)  # stage 0 on micro-batch 1 while stage 1 works on micro-batch 0
    stages = [_Meet(barrier, 1.0), _Meet(barrier, 0.0)]
    loss = gpipe_train_step(stages, devices, torch.arange(4.0).unsqueeze(1), torch.zeros(4, 1), 1, nn.functional.mse_loss)
    assert loss == pytest.approx((0 + 1 + 4 + 9) / 4)


def test_a_failing_stage_is_named_and_nobody_hangs(devices):
    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("broken stage")

    with pytest.raises(ValueError, match="broken stage") as info:
        gpipe_train_step([nn.Linear(3, 3), Broken()], devices, torch.randn(6, 3), torch.randn(6, 3), 2,
                         nn.functional.mse_loss)
    assert any("pipeline stage 1" in note and "forward" in note for note in info.value.__notes__)


@pytest.mark.parametrize("split_size", [0, -1, 2.0, True])
def test_a_bad_split_size_is_refused(devices, split_size):
    with pytest.raises(ValueError, match="positive int"):
        gpipe_train_step([nn.Linear(3, 3), nn.Linear(3, 3)], devices, torch.randn(6, 3), torch.randn(6, 3), split_size)
