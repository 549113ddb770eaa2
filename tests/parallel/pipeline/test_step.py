"""gpulab.parallel.pipeline.gpipe and .step: GPipe's training step and its baseline on two GPUs on paper.

The step runs on the thread schedule whatever the devices (tests/fake_cuda.py stands in for the
GPUs: every op's devices are checked as CUDA checks them, and work can be queued as a GPU queues
it). References: the whole model's step on the CPU (the loss and the gradients), and the work each
stage queues on its GPU (every event of the timeline must last at least that long: it times the
work, not the launch). On the CPU the step is tested in test_gpipe.py and tests/grading/test_lab07.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fake_cuda import FakeCuda, Queued
from torch import nn

from gpulab.devices import logical_devices
from gpulab.parallel import split_model
from gpulab.parallel.pipeline import gpipe_train_step, micro_batch_step

from .models import _images, _model


@pytest.mark.parametrize("overlap", [True, False])
def test_the_step_on_two_gpus_is_the_whole_models_step(overlap):
    model = _model("group")
    whole = copy.deepcopy(model)  # the reference stays on the CPU
    x, y = _images(), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])  # on the CPU, as a notebook draws them
    expected = nn.functional.cross_entropy(whole(x), y)
    expected.backward()
    with FakeCuda(num_gpus=2):
        split = split_model(model, logical_devices(2), boundaries=[4])
        timeline = []
        loss = micro_batch_step(list(split.stages), split.devices, x, y, 3, timeline=timeline, overlap=overlap)
        assert {p.grad.device for p in split.stages[1].parameters()} == {torch.device("cuda", 1)}
        grads = [p.grad.cpu() for p in split.parameters()]
    assert loss == pytest.approx(expected.item())
    for (name, p), g in zip(whole.named_parameters(), grads):
        torch.testing.assert_close(g, p.grad, msg=lambda m, n=name: f"{n}: {m}")
    assert sorted((e.phase, e.stage, e.micro_batch) for e in timeline) == sorted(
        (ph, s, j) for ph in ("forward", "backward") for s in range(2) for j in range(3))


def _queued_step(fake, overlap):
    """One step of two stages that queue known work on their GPUs; its timeline and the costs."""
    costs = {("forward", 0): 0.03, ("forward", 1): 0.02, ("backward", 0): 0.02, ("backward", 1): 0.04}
    model = nn.Sequential(Queued(fake, costs["forward", 0], costs["backward", 0]),
                          Queued(fake, costs["forward", 1], costs["backward", 1]))
    split = split_model(model, logical_devices(2), boundaries=[1])
    timeline = []
    micro_batch_step(list(split.stages), split.devices, torch.randn(8, 4), torch.randn(8, 4), 2,
                     lambda out, t: (out - t).square().mean(), timeline, overlap=overlap)
    return timeline, costs


def _overlaps(a, b) -> bool:
    return a.start < b.end and b.start < a.end


@pytest.mark.parametrize("overlap", [True, False])
def test_every_event_on_a_gpu_times_the_work_not_its_launch(overlap):
    with FakeCuda(num_gpus=2) as fake:
        timeline, costs = _queued_step(fake, overlap)
    assert len(timeline) == 16
    for e in timeline:
        assert e.duration >= 0.9 * costs[e.phase, e.stage], \
            f"{e.phase} of stage {e.stage}, micro-batch {e.micro_batch}: {e.duration:.3f} s"
    pairs = [(a, b) for a in timeline for b in timeline if a.stage == 0 and b.stage == 1]
    if overlap:  # GPipe: the two GPUs work at the same time
        assert any(_overlaps(a, b) for a, b in pairs)
    else:  # the baseline waits for each piece of work before it launches the next: no overlap at all
        assert not any(_overlaps(a, b) for a, b in pairs)


def test_gpipe_train_step_is_the_overlapped_step():
    with FakeCuda(num_gpus=2) as fake:
        model = nn.Sequential(Queued(fake, 0.02, 0.02), Queued(fake, 0.02, 0.02))
        split = split_model(model, logical_devices(2), boundaries=[1])
        timeline = []
        gpipe_train_step(list(split.stages), split.devices, torch.randn(8, 4), torch.randn(8, 4), 2,
                         lambda out, t: (out - t).square().mean(), timeline)
    assert {e.phase for e in timeline} == {"forward", "backward"}
    assert any(_overlaps(a, b) for a in timeline for b in timeline if (a.stage, b.stage) == (0, 1))
