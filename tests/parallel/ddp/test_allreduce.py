"""gpulab.parallel.ddp.allreduce: NaiveDDP and BucketedDDP train exactly like one process on the full batch;
bucketing and unused parameters.

The equality tests run 2 gloo ranks (one launch for all variants) and compare every parameter
after k optimizer steps with a single-process run on the whole batch (torch.testing.assert_close).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpulab.parallel import BucketedDDP, NaiveDDP, allreduce_gradients, bucket_assignment, launch, unused_parameters

from .nets import Net, _data

STEPS = 3


def _train(model, inputs, targets, sync=lambda: None):
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        sync()
        opt.step()


def _single_process(with_unused=False):
    model = Net(with_unused)
    _train(model, *_data())
    return dict(model.named_parameters())


def _variants(rank, world_size, with_unused):
    inputs, targets = _data()
    inputs, targets = inputs.chunk(world_size)[rank], targets.chunk(world_size)[rank]  # this rank's half
    out = {}
    for name, make in {
        "naive": lambda m: NaiveDDP(m),
        "bucketed_25mb": lambda m: BucketedDDP(m, find_unused_parameters=with_unused),
        "bucketed_tiny": lambda m: BucketedDDP(m, bucket_size_mb=1e-3, find_unused_parameters=with_unused),
    }.items():
        ddp = make(Net(with_unused))
        _train(ddp, inputs, targets, ddp.sync_gradients)
        out[name] = ({n: p.detach() for n, p in ddp.module.named_parameters()}, ddp.sync_gradients())
    return out


def test_naive_and_bucketed_equal_single_process_training():
    ref = _single_process()
    per_rank = launch(_variants, 2, args=(False,), echo=False)
    for rank, variants in enumerate(per_rank):
        for name, (params, calls) in variants.items():
            for n, p in params.items():
                torch.testing.assert_close(p, ref[n].detach(), msg=lambda m: f"rank {rank} {name} {n}: {m}")
    assert per_rank[0]["naive"][1] == 6, "naive makes one all-reduce per parameter tensor"
    assert per_rank[0]["bucketed_25mb"][1] == 1, "everything fits in one 25 MB bucket"
    assert per_rank[0]["bucketed_tiny"][1] > 1


def test_find_unused_parameters_equals_single_process():
    ref = _single_process(with_unused=True)
    per_rank = launch(_variants, 2, args=(True,), echo=False)
    for variants in per_rank:
        for name, (params, _) in variants.items():
            for n, p in params.items():
                torch.testing.assert_close(p, ref[n].detach())


def _unused_without_flag(rank, world_size):
    model = BucketedDDP(Net(with_unused=True))
    x, y = _data()
    nn.functional.cross_entropy(model(x), y).backward()


def test_an_unused_parameter_without_the_flag_names_it():
    with pytest.raises(Exception, match=r"unused\.weight.*find_unused_parameters=True"):
        launch(_unused_without_flag, 2, timeout=60, echo=False)


def test_replicas_start_from_rank_0_weights():
    def worker(rank, world_size):
        torch.manual_seed(rank)  # deliberately different initial weights
        model = NaiveDDP(nn.Linear(4, 2))
        return model.module.weight.detach()

    w0, w1 = launch(worker, 2, echo=False)
    torch.testing.assert_close(w0, w1)


def test_bucket_assignment():
    params = [nn.Parameter(torch.zeros(n)) for n in (256, 256, 1024, 256, 256)]  # 1, 1, 4, 1, 1 KiB
    kib = 1 / 1024
    assert bucket_assignment(params, 2 * kib) == [[4, 3], [2], [1, 0]], "reverse order; the 4 KiB one alone"
    assert bucket_assignment(params, 100) == [[4, 3, 2, 1, 0]]
    mixed = [nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(4, dtype=torch.float64))]
    assert bucket_assignment(mixed, 100) == [[1], [0]], "a bucket is one flat tensor: one dtype"
    with pytest.raises(ValueError, match="bucket_size_mb must be > 0"):
        bucket_assignment(params, 0)


def test_wrappers_need_a_process_group():
    with pytest.raises(RuntimeError, match="launch"):
        NaiveDDP(nn.Linear(2, 2))


def test_unused_parameters_finds_the_branch_and_leaves_grads_alone():
    model = Net(with_unused=True)
    x, _ = _data()
    assert unused_parameters(model, x) == ["unused.weight", "unused.bias"]
    assert all(p.grad is None for p in model.parameters())
    assert unused_parameters(Net(), x) == []


def _plan_rank(rank, world_size, plan):
    BucketedDDP(Net(), assign_buckets=lambda params, mb: plan)


def test_a_custom_bucket_plan_must_cover_every_parameter_once():
    with pytest.raises(Exception, match="every parameter index 0..5 exactly once"):
        launch(_plan_rank, 1, args=([[5, 4], [3, 2, 1]],), echo=False)  # index 0 is missing
    with pytest.raises(Exception, match="exactly once"):
        launch(_plan_rank, 1, args=([[5, 4, 3], [3, 2, 1, 0]],), echo=False)  # index 3 twice


def test_allreduce_gradients_counts_its_calls_and_fills_missing_grads():
    def worker(rank, world_size):
        model = Net(with_unused=True)
        x, y = _data()
        nn.functional.cross_entropy(model(x.chunk(2)[rank]), y.chunk(2)[rank]).backward()
        calls = allreduce_gradients(model, world_size)
        return calls, model.unused.weight.grad.abs().sum().item(), model.out.weight.grad

    (c0, z0, g0), (c1, z1, g1) = launch(worker, 2, echo=False)
    assert c0 == c1 == 8 and z0 == z1 == 0.0
    torch.testing.assert_close(g0, g1)  # both ranks hold the same averaged gradient
