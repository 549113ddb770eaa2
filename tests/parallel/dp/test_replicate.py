"""gpulab.parallel.dp.replicate: one module object per device, parameters broadcast differentiably
(gradients sum onto the original), buffers with torch's semantics (replica 0 shares them)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from gpulab.devices import logical_devices, placement
from gpulab.parallel import comm
from gpulab.parallel.dp.replicate import replicate


@pytest.fixture
def devs():
    return logical_devices(3, physical=["cpu"])


def test_replicas_are_separate_objects_on_their_devices(devs) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2, bias=False))
    replicas = replicate(model, devs)
    assert len({id(r) for r in replicas}) == 3 and all(r is not model for r in replicas)
    assert len({id(r[0]) for r in replicas}) == 3  # submodules are copied too
    assert replicas[0][0].weight is model[0].weight  # replica 0 uses the original parameters
    for r, d in zip(replicas, devs):
        assert placement(r[0].weight) == d and r[2].bias is None
        torch.testing.assert_close(r[0].weight, model[0].weight)
        assert list(r.parameters()) == []  # copies are not leaves, so not Parameters
    assert replicas[1].training and isinstance(replicas[1], nn.Sequential)


def test_gradients_of_all_replicas_sum_onto_the_original(devs) -> None:
    model = nn.Linear(4, 2)
    xs = [torch.randn(3, 4) for _ in devs]
    replicas = replicate(model, devs)
    sum(r(comm.to(x, d)).pow(2).sum() for r, x, d in zip(replicas, xs, devs)).backward()
    ref = nn.Linear(4, 2)
    ref.load_state_dict(model.state_dict())
    sum(ref(x).pow(2).sum() for x in xs).backward()
    torch.testing.assert_close(model.weight.grad, ref.weight.grad)
    torch.testing.assert_close(model.bias.grad, ref.bias.grad)
    assert placement(model.weight.grad) == devs[0]


def test_tied_weights_stay_tied_in_each_replica(devs) -> None:
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    replicas = replicate(nn.Sequential(a, b), devs)
    assert all(r[0].weight is r[1].weight for r in replicas)


def test_buffers_follow_torch_replica_0_shares_the_others_copy(devs) -> None:
    bn = nn.BatchNorm1d(2)
    replicas = replicate(bn, devs)
    assert replicas[0].running_mean is bn.running_mean
    assert replicas[1].running_mean is not bn.running_mean and placement(replicas[1].running_mean) == devs[1]
    assert not replicas[1].running_mean.requires_grad
    for r in replicas:
        r(torch.randn(8, 2) + 5)
    assert bn.num_batches_tracked.item() == 1  # only replica 0's update reached the original
    assert bn.running_mean.mean() > 0.3


def test_replicas_run_concurrently_without_sharing_state(devs) -> None:
    """Each thread reads its own replica's weights (functional_call on one module would race)."""
    model = nn.Linear(64, 64)
    nn.init.zeros_(model.bias)  # 64 + b - b is not always 64.0 in float32: keep the sums exact
    replicas = replicate(model, devs)
    for i, r in enumerate(replicas[1:], 1):
        r.__dict__["weight"] = torch.full((64, 64), float(i))  # make the replicas tell apart
    x = torch.ones(1, 64)
    results: dict[int, list[float]] = {}

    def work(i: int) -> None:
        with torch.no_grad():
            results[i] = [float(replicas[i](x)[0, 0] - model.bias[0]) for _ in range(200)]

    threads = [threading.Thread(target=work, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results[1]) == {64.0} and set(results[2]) == {128.0}


def test_a_model_not_on_the_first_device_is_refused(devs) -> None:
    model = comm.to(nn.Linear(2, 2), devs[1])
    with pytest.raises(ValueError, match="devices\\[0\\]"):
        replicate(model, devs)
