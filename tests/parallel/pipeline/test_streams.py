"""gpulab.parallel.pipeline.streams: CUDA-stream pipelines on one and two GPUs equal the whole model.

The GPU tests run where there are GPUs. On a CPU the stream schedule runs on two GPUs on paper
(tests/fake_cuda.py): its timeline must hold both passes, timed by events that wait for the work.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fake_cuda import FakeCuda, Queued

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
    assert sorted((e.phase, e.stage, e.micro_batch) for e in pipe.timeline) == sorted(
        (ph, s, j) for ph in ("forward", "backward") for s in range(2) for j in range(3))  # the last call's passes


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
    assert {e.phase for e in timeline} == {"forward", "backward"}  # gpipe_train_step: the thread schedule


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


def test_the_stream_timeline_of_a_training_step_holds_both_passes_on_two_gpus_on_paper():
    costs = {("forward", 0): 0.01, ("forward", 1): 0.02, ("backward", 0): 0.03, ("backward", 1): 0.01}
    with FakeCuda(num_gpus=2) as fake:
        model = torch.nn.Sequential(Queued(fake, costs["forward", 0], costs["backward", 0]),
                                    Queued(fake, costs["forward", 1], costs["backward", 1]))
        pipe = PipelinedModel(split_model(model, logical_devices(2), boundaries=[1]), 2)
        assert pipe.uses_streams and "real devices" in pipe.mode
        x, y = torch.randn(6, 4), torch.randn(6, 4)
        (pipe(x) - y.to("cuda:1")).square().mean().backward()
        events = {(e.phase, e.stage, e.micro_batch): e for e in pipe.timeline}
        assert len(pipe.timeline) == len(events) == 12
    assert set(events) == {(ph, s, j) for ph in ("forward", "backward") for s in range(2) for j in range(3)}
    for (phase, stage, j), e in events.items():  # each event waits for the work queued on its GPU
        assert e.duration >= 0.9 * costs[phase, stage], f"{phase} of stage {stage}, micro-batch {j}: {e.duration:.3f} s"
    for stage in range(2):  # one GPU runs its queue in order: the backward after the stage's last forward
        last_forward = max(events["forward", stage, j].end for j in range(3))
        assert all(events["backward", stage, j].start >= last_forward - 1e-6 for j in range(3))
