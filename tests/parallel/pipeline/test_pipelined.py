"""gpulab.parallel.pipeline.pipelined: PipelinedModel against the unsplit model.

References: the whole model (outputs in eval mode; gradients of a model whose normalisation is
per sample, GroupNorm), the schedule's dependencies read off the recorded timeline, and a barrier
that only two stages working at the same time can pass (overlap without timing anything).
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from gpulab.devices import MemoryMeter, logical_devices, placement
from gpulab.parallel import PipelinedModel, split_model

from .models import _images, _model


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


@pytest.mark.parametrize("split_size", [1, 3, 4, 8, 100])  # 3 does not divide 8; 8 and 100: one micro-batch
def test_pipelined_matches_the_whole_model_in_eval_mode(devices, split_size):
    model = _model().eval()
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devices, boundaries=[4]), split_size)
    x = _images()
    out = pipe(x)
    torch.testing.assert_close(out, whole(x))
    assert placement(out) == devices[1]
    with torch.no_grad():
        torch.testing.assert_close(pipe(x), whole(x))
    assert len(pipe.timeline) == 2 * pipe.num_micro_batches(8)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("split_size", [3, 8])
def test_pipelined_gradients_match_the_whole_model(devices, split_size, overlap):
    model = _model("group").train()
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devices, boundaries=[3]), split_size, overlap=overlap)
    x1, x2 = _images().requires_grad_(), _images().requires_grad_()
    weights = torch.linspace(-1, 1, 5, dtype=torch.double)
    out1, out2 = whole(x1), pipe(x2)
    torch.testing.assert_close(out2, out1)
    (out1 * weights).square().mean().backward()
    (out2 * weights).square().mean().backward()
    torch.testing.assert_close(x2.grad, x1.grad)
    assert placement(x2.grad) == devices[0]
    for (name, p1), p2 in zip(whole.named_parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, msg=lambda m, n=name: f"{n}: {m}")
    events = pipe.timeline
    m = pipe.num_micro_batches(8)
    assert sorted((e.phase, e.stage, e.micro_batch) for e in events) == sorted(
        (ph, s, j) for ph in ("forward", "backward") for s in range(2) for j in range(m))


def test_parameters_get_gradients_when_the_input_does_not_need_one(devices):
    model = _model("group")
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devices, boundaries=[5]), 3)
    x = _images()
    whole(x).sum().backward()
    pipe(x).sum().backward()
    for p1, p2 in zip(whole.parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad)


def test_three_stages(devices):
    devs = logical_devices(3, ["cpu"])
    model = _model("group")
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devs, boundaries=[2, 6]), 3)
    x1, x2 = _images().requires_grad_(), _images().requires_grad_()
    whole(x1).sum().backward()
    pipe(x2).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad)
    for p1, p2 in zip(whole.parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad)


def test_the_schedule_respects_every_dependency(devices):
    pipe = PipelinedModel(split_model(_model("group"), devices, boundaries=[4]), 2)
    pipe(_images()).sum().backward()
    at = {(e.phase, e.stage, e.micro_batch): e for e in pipe.timeline}
    for j in range(4):
        # forward: stage 1 starts a micro-batch after stage 0 finished it; backward the other way
        assert at["forward", 1, j].start >= at["forward", 0, j].end
        assert at["backward", 0, j].start >= at["backward", 1, j].end
        assert at["backward", 1, j].start >= max(at["forward", 1, k].end for k in range(4))
        if j:  # each stage takes the micro-batches in order
            for s in range(2):
                assert at["forward", s, j].start >= at["forward", s, j - 1].end


class _Meet(nn.Module):
    """Waits at a barrier on one chosen micro-batch: passes only if the other stage waits too."""

    def __init__(self, barrier: threading.Barrier, at_call: int) -> None:
        super().__init__()
        self.barrier, self.at_call, self.calls = barrier, at_call, 0

    def forward(self, x):
        if self.calls == self.at_call:
            self.barrier.wait()
        self.calls += 1
        return x * 1.0


def test_stages_really_run_at_the_same_time(devices):
    # Stage 0 on micro-batch 1 and stage 1 on micro-batch 0 must meet: only a pipeline can.
    barrier = threading.Barrier(2, timeout=10)
    split = split_model(nn.Sequential(_Meet(barrier, 1), _Meet(barrier, 0)), devices)
    out = PipelinedModel(split, 1)(torch.arange(3.0).unsqueeze(1))
    torch.testing.assert_close(out, torch.arange(3.0).unsqueeze(1))
    assert not barrier.broken


def test_sequential_mode_does_not_overlap(devices):
    barrier = threading.Barrier(2, timeout=0.5)
    split = split_model(nn.Sequential(_Meet(barrier, 1), _Meet(barrier, 0)), devices)
    with pytest.raises(threading.BrokenBarrierError) as info:
        PipelinedModel(split, 1, overlap=False)(torch.arange(3.0).unsqueeze(1))
    assert any("stage 1" in n for n in info.value.__notes__)


class _Fails(nn.Module):
    def __init__(self, on_call: int, phase: str = "forward") -> None:
        super().__init__()
        self.on_call, self.phase, self.calls = on_call, phase, 0
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x):
        self.calls += 1
        if self.phase == "forward" and self.calls == self.on_call + 1:
            raise ValueError("boom in forward")
        x = x * self.weight
        return _BackwardBoom.apply(x) if self.phase == "backward" else x


class _BackwardBoom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("boom in backward")


def _stage_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gpulab-stage")]


@pytest.mark.parametrize("overlap", [True, False])
def test_an_exception_in_a_stage_thread_names_the_stage(devices, overlap):
    split = split_model(nn.Sequential(nn.Linear(3, 3), _Fails(on_call=2)), devices)
    pipe = PipelinedModel(split, 2, overlap=overlap)
    with pytest.raises(ValueError, match="boom in forward") as info:
        pipe(torch.randn(10, 3))
    assert "raised in pipeline stage 1 (on logical:1 -> cpu (simulated)), micro-batch 2, forward" in info.value.__notes__
    assert not _stage_threads()


def test_an_exception_in_a_backward_stage_names_the_stage(devices):
    split = split_model(nn.Sequential(_Fails(0, "backward"), nn.Linear(3, 3)), devices)
    out = PipelinedModel(split, 4)(torch.randn(10, 3))
    with pytest.raises(ValueError, match="boom in backward") as info:
        out.sum().backward()
    assert any("stage 0" in n and "backward" in n for n in info.value.__notes__)
    assert not _stage_threads()


def test_batchnorm_normalises_each_micro_batch_on_its_own(devices):
    # The caveat the lab shows: in train mode the pipelined model is not the whole model.
    model = _model().train()
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devices, boundaries=[4]), 2)
    x = _images()
    assert not torch.allclose(pipe(x), whole(x), atol=1e-3)
    bn1, bn2 = whole.stages[0][1], pipe.split.stages[0][0][1]
    assert bn2.num_batches_tracked.item() == 4 * bn1.num_batches_tracked.item()  # one update per micro-batch


def test_backward_twice_is_a_clear_error(devices):
    pipe = PipelinedModel(split_model(_model("group"), devices), 4)
    out = pipe(_images())
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        out.sum().backward()


def test_memory_meter_follows_the_stage_threads(devices):
    pipe = PipelinedModel(split_model(_model(), devices, boundaries=[4]), 4).eval()
    with MemoryMeter() as meter, torch.no_grad():
        pipe(_images())
    assert meter.peak(devices[0]) > 0 and meter.peak(devices[1]) > 0


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, None])
def test_bad_split_size_is_rejected(devices, bad):
    with pytest.raises(ValueError, match="positive int"):
        PipelinedModel(split_model(_model(), devices), bad)


def test_bad_arguments(devices):
    with pytest.raises(TypeError, match="split_model"):
        PipelinedModel(_model(), 4)
    pipe = PipelinedModel(split_model(_model(), devices), 4)
    with pytest.raises(ValueError, match="at least one row"):
        pipe(torch.zeros(0, 3, 32, 32, dtype=torch.double))
    assert "CPU threads" in pipe.mode and "simulated" in pipe.mode


def test_a_stage_may_start_with_an_in_place_layer(devices):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 2))
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devices, boundaries=[1]), 3)
    x1 = torch.randn(7, 4, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    whole(x1).square().sum().backward()
    pipe(x2).square().sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad)
    for p1, p2 in zip(whole.parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad)
