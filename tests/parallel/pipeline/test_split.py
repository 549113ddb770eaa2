"""gpulab.parallel.pipeline.split: split_model against the unsplit model.

References: the same model run whole (outputs, gradients, BatchNorm running statistics), a brute
force search over every cut (balancing), and FLOPs counted by hand (a Linear layer).
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch import nn

from gpulab.devices import MemoryMeter, logical_devices, placement
from gpulab.models import resnet
from gpulab.parallel import SplitModel, split_model
from gpulab.parallel.pipeline.split import balanced_boundaries, layer_costs, model_layers


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


def _resnet(depth: int = 18, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return resnet(depth, num_classes=5, width=4).double()


def _images(n: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.double)


@pytest.mark.parametrize("depth", [18, 50])
def test_split_matches_the_whole_model_in_eval_mode(devices, depth):
    model = _resnet(depth).eval()
    whole = copy.deepcopy(model)
    split = split_model(model, devices)
    x = _images()
    torch.testing.assert_close(split(x), whole(x))


def test_split_matches_the_whole_model_in_training_mode_gradients_and_bn_stats(devices):
    # No micro-batches: the split sees the whole batch, so even BatchNorm's statistics agree.
    model = _resnet().train()
    whole = copy.deepcopy(model)
    split = split_model(model, devices, boundaries=[4])
    x1, x2 = _images().requires_grad_(), _images().requires_grad_()
    out1, out2 = whole(x1), split(x2)
    torch.testing.assert_close(out2, out1)
    (out1 * torch.arange(5.0, dtype=torch.double)).sum().backward()
    (out2 * torch.arange(5.0, dtype=torch.double)).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad)
    for (name, p1), p2 in zip(whole.named_parameters(), split.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, msg=lambda m, n=name: f"{n}: {m}")
    for (name, b1), b2 in zip(whole.named_buffers(), split.buffers()):
        torch.testing.assert_close(b2, b1, msg=lambda m, n=name: f"{n}: {m}")


def test_stages_and_output_live_on_their_devices(devices):
    split = split_model(_resnet(), devices, boundaries=[3])
    for stage, dev in zip(split.stages, devices):
        assert all(placement(p) == dev for p in stage.parameters())
    out = split(_images())
    assert placement(out) == devices[1]
    assert split.boundaries == [3]
    assert [len(s) for s in split.stages] == [3, len(model_layers(_resnet())) - 3]
    assert "stage 1: layers 3-9" in split.describe()


def test_meter_sees_the_activation_copied_to_the_second_device(devices):
    split = split_model(_resnet(), devices, boundaries=[3])
    x = _images()
    with torch.no_grad():
        h = nn.Sequential(*model_layers(_resnet())[:3]).eval()(x)  # shape of the hand-off only
    with MemoryMeter() as meter, torch.no_grad():
        split.eval()(x)
    assert meter.peak(devices[1]) >= h.numel() * h.element_size()  # at least the copied activation


def test_three_stages_on_three_devices():
    devs = logical_devices(3, ["cpu"])
    model = _resnet().eval()
    whole = copy.deepcopy(model)
    split = split_model(model, devs, boundaries=[2, 6])
    x = _images()
    torch.testing.assert_close(split(x), whole(x))
    assert [len(s) for s in split.stages] == [2, 4, 4]


def test_more_stages_than_layers_is_a_clear_error():
    devs = logical_devices(3, ["cpu"])
    with pytest.raises(ValueError, match=r"cannot split 2 layers into 3 stages.*at most 2 devices"):
        split_model(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), devs)


@pytest.mark.parametrize("bounds", [[], [1, 2], [0], [10], [11], [2.5], [True]])
def test_bad_boundaries_are_rejected(devices, bounds):
    with pytest.raises(ValueError, match="boundar"):
        split_model(_resnet(), devices, boundaries=bounds)


def test_decreasing_boundaries_are_rejected():
    with pytest.raises(ValueError, match="increase strictly"):
        split_model(_resnet(), logical_devices(3, ["cpu"]), boundaries=[5, 3])


def test_models_that_are_not_a_sequence_of_layers_are_rejected(devices):
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x):
            return self.a(x) + self.b(x)

    with pytest.raises(TypeError, match="nn.Sequential"):
        split_model(Branchy(), devices)
    with pytest.raises(TypeError, match="LogicalDevice"):
        split_model(_resnet(), ["cpu", "cpu"])


def _brute_force(costs, stages):
    n = len(costs)
    return min(max(sum(costs[a:b]) for a, b in zip((0, *cut), (*cut, n)))
               for cut in itertools.combinations(range(1, n), stages - 1))


@pytest.mark.parametrize("seed", range(6))
def test_balanced_boundaries_minimise_the_slowest_stage(seed):
    g = torch.Generator().manual_seed(seed)
    costs = (torch.rand(9, generator=g) * 10).tolist()
    for stages in (1, 2, 3, 4, 9):
        cut = balanced_boundaries(costs, stages)
        assert len(cut) == stages - 1 and cut == sorted(set(cut))
        got = max(sum(costs[a:b]) for a, b in zip((0, *cut), (*cut, len(costs))))
        assert got == pytest.approx(_brute_force(costs, stages))


def test_default_balance_is_by_parameter_count(devices):
    layers = model_layers(_resnet())
    params = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    split = split_model(_resnet(), devices)
    assert max(split.stage_params()) == _brute_force(params, 2)


def test_flops_balance_counts_what_the_layers_compute(devices):
    layers = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)]
    costs = layer_costs(layers, "flops", torch.randn(5, 8))
    assert costs == [2 * 5 * 8 * 16, 0, 2 * 5 * 16 * 4]
    split = split_model(nn.Sequential(*layers), devices, balance="flops", sample=torch.randn(5, 8))
    assert split.boundaries == [1]


def test_time_balance_leaves_batchnorm_and_modes_alone(devices):
    model = _resnet().train()
    before = copy.deepcopy(model.state_dict())
    costs = layer_costs(model_layers(model), "time", _images(2), repeats=1)
    assert len(costs) == 10 and all(c > 0 for c in costs)
    assert all(m.training for m in model.modules())
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])
    split = split_model(model, devices, balance="time", sample=_images(2))
    assert len(split.stages) == 2


def test_time_and_flops_balance_need_a_sample(devices):
    for balance in ("time", "forward_time", "flops"):
        with pytest.raises(ValueError, match="sample="):
            split_model(_resnet(), devices, balance=balance)
    with pytest.raises(ValueError, match="'params', 'time', 'forward_time' or 'flops'"):
        split_model(_resnet(), devices, balance="memory")


def test_split_model_class_checks_its_arguments(devices):
    with pytest.raises(ValueError, match="one device per stage"):
        SplitModel([nn.Linear(2, 2)], devices)
