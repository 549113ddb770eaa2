"""gpulab.parallel.pipeline.balance: the per-pass cut against a brute force over every cut, and the
measured phase times against what a training step does (BatchNorm statistics, .grad, the stem's
input gradient). On GPUs on paper (tests/fake_cuda.py): the times are measured where the stages
will run, and they time the work queued on the GPU, not its launch. No test depends on machine speed.
"""

from __future__ import annotations

import copy
import itertools
import time

import pytest
import torch
from fake_cuda import FakeCuda, Queued
from torch import nn

from gpulab.devices import logical_devices
from gpulab.models import resnet
from gpulab.parallel import split_model
from gpulab.parallel.pipeline import balance
from gpulab.parallel.pipeline.balance import balanced_boundaries, choose_boundaries, phase_times, pipeline_boundaries


def _per_pass_cost(forward, backward, cut):
    edges = list(zip((0, *cut), (*cut, len(forward))))
    return max(sum(forward[a:b]) for a, b in edges) + max(sum(backward[a:b]) for a, b in edges)


@pytest.mark.parametrize("seed", range(5))
def test_pipeline_boundaries_minimise_the_slowest_forward_plus_the_slowest_backward(seed):
    g = torch.Generator().manual_seed(seed)
    forward, backward = (torch.rand(8, generator=g) * 10).tolist(), (torch.rand(8, generator=g) * 20).tolist()
    for stages in (1, 2, 3, 4, 8):
        cut = pipeline_boundaries(forward, backward, stages)
        assert len(cut) == stages - 1 and cut == sorted(set(cut))
        best = min(_per_pass_cost(forward, backward, c) for c in itertools.combinations(range(1, 8), stages - 1))
        assert _per_pass_cost(forward, backward, cut) == pytest.approx(best)


def test_a_cut_balanced_on_the_sums_can_leave_one_pass_lopsided():
    # a ResNet's shape: the first layer's backward is cheap (no input gradient), the later layers'
    # backward costs twice their forward. Both cuts give stages of 12 and 18 (forward + backward),
    # but [2] runs the passes at 8 + 12 per micro-batch, [3] at 10 + 8.
    forward, backward = [7, 1, 2, 1, 3], [2, 2, 4, 2, 6]
    by_sums = balanced_boundaries([f + b for f, b in zip(forward, backward)], 2)
    per_pass = pipeline_boundaries(forward, backward, 2)
    assert by_sums == [2] and per_pass == [3]
    assert _per_pass_cost(forward, backward, per_pass) < _per_pass_cost(forward, backward, by_sums)


def test_too_many_cuts_falls_back_to_balancing_the_sums(monkeypatch):
    forward, backward = [7, 1, 2, 1, 3], [2, 2, 4, 2, 6]
    monkeypatch.setattr(balance, "MAX_CUTS_TRIED", 1)
    assert pipeline_boundaries(forward, backward, 2) == balanced_boundaries([9, 3, 6, 3, 9], 2) == [2]


def test_pipeline_boundaries_reject_bad_input():
    with pytest.raises(ValueError, match="one forward and one backward cost per layer"):
        pipeline_boundaries([1, 2], [1], 2)
    with pytest.raises(ValueError, match="cannot cut 2 layers into 3 stages"):
        pipeline_boundaries([1, 2], [1, 2], 3)


class _Records(nn.Module):
    """A linear layer that remembers whether its input needed a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.seen = nn.Linear(4, 4), []

    def forward(self, x):
        self.seen.append(x.requires_grad)
        return self.linear(x)


def test_phase_times_run_a_training_step_and_leave_no_trace():
    torch.manual_seed(0)
    model = resnet(18, num_classes=5, width=4).double().train()
    layers = list(model.layers())
    before = copy.deepcopy(model.state_dict())
    forward, backward = phase_times(layers, torch.randn(4, 3, 32, 32, dtype=torch.double), repeats=1)
    assert len(forward) == len(backward) == 10 and all(t > 0 for t in forward + backward)
    for k, v in model.state_dict().items():  # BatchNorm's running statistics as they were
        torch.testing.assert_close(v, before[k])
    assert all(m.training for m in model.modules()) and all(p.grad is None for p in model.parameters())
    eval_model = copy.deepcopy(model).eval()
    phase_times(list(eval_model.layers()), torch.randn(2, 3, 32, 32, dtype=torch.double), repeats=1)
    assert not any(m.training for m in eval_model.modules())  # the caller's mode comes back


def test_the_first_layer_skips_its_input_gradient_unless_the_sample_needs_one():
    first, second = _Records(), _Records()
    phase_times([first, second], torch.randn(3, 4), repeats=1)
    assert not any(first.seen) and all(second.seen)
    first.seen.clear()
    phase_times([first, second], torch.randn(3, 4, requires_grad=True), repeats=1)
    assert all(first.seen)
    forward, backward = phase_times([first, second], torch.randn(3, 4), backward=False, repeats=1)
    assert backward == [0.0, 0.0] and all(t > 0 for t in forward)


def test_time_balance_cuts_by_the_measured_passes(monkeypatch):
    # the measurement replaced by known figures: the per-pass cut is the one taken
    monkeypatch.setattr(balance, "phase_times", lambda layers, sample, **kw: ([7, 1, 2, 1, 3], [2, 2, 4, 2, 6]))
    layers = [nn.Linear(2, 2) for _ in range(5)]
    assert choose_boundaries(layers, 2, "time", torch.randn(1, 2)) == [3]
    split = split_model(nn.Sequential(*layers), logical_devices(2, ["cpu"]), balance="time", sample=torch.randn(1, 2))
    assert split.boundaries == [3]
    with pytest.raises(ValueError, match="sample="):
        choose_boundaries(layers, 2, "time")


def _spin(seconds: float) -> None:
    """Burn ``seconds`` of this process's CPU time (what phase_times clocks on a CPU)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class _SpinBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _spin(ctx.seconds)
        return g, None


class _Spins(nn.Module):
    """A linear layer that burns a known CPU time in forward and in backward."""

    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.linear, self.forward_s, self.backward_s = nn.Linear(4, 4), forward_s, backward_s

    def forward(self, x):
        _spin(self.forward_s)
        return _SpinBack.apply(self.linear(x), self.backward_s)


def test_phase_times_charge_each_pass_to_its_layer():
    # CPU time burnt is the same on any machine, loaded or not; the other layers' passes stay far under it
    layers = [_Spins(0.0, 0.05), _Spins(0.05, 0.0), _Spins(0.0, 0.0)]
    forward, backward = phase_times(layers, torch.randn(3, 4), repeats=1)
    assert forward[1] >= 0.05 and backward[0] >= 0.05
    assert forward[0] < 0.03 and backward[1] < 0.03 and forward[2] < 0.03 and backward[2] < 0.03


class _Where(nn.Module):
    """A linear layer that notes the device of every input it gets (in a class attribute: the
    measurement may run on a copy of the layer)."""

    seen: list[torch.device] = []

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        _Where.seen.append(x.device)
        return self.linear(x)


def test_time_balance_measures_where_the_stages_will_run():
    # two GPUs on paper; the model and the sample on the CPU, as a notebook makes them
    _Where.seen.clear()
    with FakeCuda(num_gpus=2):
        layers = [_Where() for _ in range(4)]
        split = split_model(nn.Sequential(*layers), logical_devices(2), balance="time", sample=torch.randn(3, 4))
        assert set(_Where.seen) == {torch.device("cuda", 0)}, "measured on the CPU, for stages on GPUs"
        assert {p.device for p in split.stages[0].parameters()} == {torch.device("cuda", 0)}
        assert {p.device for p in split.stages[1].parameters()} == {torch.device("cuda", 1)}
        _Where.seen.clear()
        on_gpu = [_Where().to("cuda:1") for _ in range(2)]
        phase_times(on_gpu, torch.randn(3, 4), repeats=1)  # by default, where the layers are
        assert set(_Where.seen) == {torch.device("cuda", 1)}
        assert all(p.device == torch.device("cuda", 1) for layer in on_gpu for p in layer.parameters())


def test_gpu_times_are_the_work_not_the_launch():
    # each layer queues known work on the GPU and returns at once, as a kernel launch does: a clock
    # read without waiting for the GPU charges all of it to whoever waits last
    costs = [(0.01, 0.06), (0.05, 0.02), (0.02, 0.04)]  # (forward, backward) seconds per layer
    with FakeCuda(num_gpus=1) as fake:
        layers = [Queued(fake, f, b).to("cuda:0") for f, b in costs]
        forward, backward = phase_times(layers, torch.randn(3, 4, device="cuda:0"), repeats=1)
    for i, ((f, b), f_t, b_t) in enumerate(zip(costs, forward, backward)):
        assert f_t >= 0.9 * f and b_t >= 0.9 * b, f"layer {i}: measured {f_t:.3f} / {b_t:.3f} s for {f} / {b} s of work"
    assert backward[0] < costs[0][1] + 0.03  # the first layer is not charged the others' backward
