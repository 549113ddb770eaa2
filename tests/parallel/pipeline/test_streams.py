"""gpulab.parallel.pipeline.streams: CUDA-stream pipelines on one and two GPUs equal the whole model."""

from __future__ import annotations

import copy

import pytest
import torch

from gpulab.devices import cuda_device_count, logical_devices
from gpulab.parallel import PipelinedModel, split_model
from gpulab.parallel.pipeline import gpipe_train_step

from .models import _images, _model


@pytest.mark.gpu
def test_cuda_streams_on_one_gpu_match_the_whole_model():
    devs = logical_devices(2, ["cuda:0"])
    model = _model("group").float().cuda()
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devs, boundaries=[4]), 3)
    assert pipe.uses_streams and "simulated" in pipe.mode
    x1 = _images().float().cuda().requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    torch.testing.assert_close(pipe(x2), whole(x1), rtol=1e-4, atol=1e-4)
    whole(x1).sum().backward()
    pipe(x2).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-5)
    for p1, p2 in zip(whole.parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-4, atol=1e-4)
    assert len(pipe.timeline) == 2 * 3


@pytest.mark.multigpu
def test_cuda_streams_on_two_gpus_match_the_whole_model():
    devs = logical_devices(2)
    assert not devs.simulated and cuda_device_count() >= 2
    model = _model("group").float()
    whole = copy.deepcopy(model).cuda()
    pipe = PipelinedModel(split_model(model, devs, boundaries=[4]), 3)
    assert "real devices" in pipe.mode
    x = _images().float().cuda()
    out = pipe(x)
    assert out.device == torch.device("cuda", 1)
    torch.testing.assert_close(out.cpu(), whole(x).cpu(), rtol=1e-4, atol=1e-4)
    out.sum().backward()
    whole(x).sum().backward()
    for p1, p2 in zip(whole.parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad.cpu(), p1.grad.cpu(), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpipe_train_step_on_one_gpu_is_the_whole_models_step():
    # written from torch's CUDA semantics documentation; not run where there is no GPU
    devs = logical_devices(2, ["cuda:0"])
    model = _model("group").float().cuda()
    whole = copy.deepcopy(model)
    split = split_model(model, devs, boundaries=[4])
    x, y = _images().float().cuda(), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2], device="cuda")
    expected = torch.nn.functional.cross_entropy(whole(x), y)
    expected.backward()
    timeline = []
    loss = gpipe_train_step(list(split.stages), split.devices, x, y, 3, timeline=timeline)
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for p1, p2 in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-4, atol=1e-4)
    assert {e.phase for e in timeline} == {"forward"}  # the stream schedule times the forward only


@pytest.mark.gpu
def test_forward_backward_on_one_gpu_is_the_whole_models_step():
    # the streams path runs GPipe's two passes (no fused sweep on GPUs); not run where there is no GPU
    devs = logical_devices(2, ["cuda:0"])
    model = _model("group").float().cuda()
    whole = copy.deepcopy(model)
    pipe = PipelinedModel(split_model(model, devs, boundaries=[4]), 3)
    x, y = _images().float().cuda(), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2], device="cuda")
    expected = torch.nn.functional.cross_entropy(whole(x), y)
    expected.backward()
    assert pipe.forward_backward(x, y) == pytest.approx(expected.item(), rel=1e-5)
    for p1, p2 in zip(whole.parameters(), pipe.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-4, atol=1e-4)
