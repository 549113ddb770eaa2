"""gpulab.parallel.ddp.allreduce and .bucketed: NaiveDDP, OverlappedDDP and BucketedDDP train exactly like
one process on the full batch; bucketing, tied weights and unused parameters.

The equality tests run 2 gloo ranks (one launch for all variants) and compare every parameter
after k optimizer steps (momentum and weight decay: a zero gradient where one process has None
would move a parameter) with a single-process run on the whole batch (torch.testing.assert_close).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpulab.parallel import (
    BucketedDDP,
    NaiveDDP,
    OverlappedDDP,
    allreduce_gradients,
    bucket_assignment,
    launch,
    unused_parameters,
)
from gpulab.parallel.workloads.ddp_examples import TiedEmbeddingNet, token_data

from .nets import Net, _data

STEPS = 3


def _train(model, inputs, targets, sync=lambda: 0):
    """STEPS steps; returns what ``sync`` returned after the last backward (the all-reduce calls)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, weight_decay=0.05)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        calls = sync()
        opt.step()
    return calls


def _single_process(make_model, data):
    model = make_model()
    _train(model, *data)
    return model


WRAPPERS = {
    "naive": lambda m, unused: NaiveDDP(m),
    "overlapped": lambda m, unused: OverlappedDDP(m),
    "bucketed_25mb": lambda m, unused: BucketedDDP(m, find_unused_parameters=unused),
    "bucketed_tiny": lambda m, unused: BucketedDDP(m, bucket_size_mb=1e-3, find_unused_parameters=unused),
}
MODELS = {"net": (Net, _data), "unused": (lambda: Net(with_unused=True), _data),
          "tied": (TiedEmbeddingNet, lambda: token_data(16))}


def _variants(rank, world_size, model_name, wrappers):
    make_model, data = MODELS[model_name]
    inputs, targets = (t.chunk(world_size)[rank] for t in data())  # this rank's half
    out = {}
    for name in wrappers:
        model = make_model()
        ddp = WRAPPERS[name](model, model_name == "unused")
        calls = _train(ddp, inputs, targets, ddp.finish)
        out[name] = ({n: p.detach() for n, p in model.named_parameters()},
                     [n for n, p in model.named_parameters() if p.grad is None], calls)
    return out


def _assert_like_one_process(model_name, wrappers):
    make_model, data = MODELS[model_name]
    ref = _single_process(make_model, data())
    per_rank = launch(_variants, 2, args=(model_name, wrappers), echo=False)
    for rank, variants in enumerate(per_rank):
        for name, (params, grad_none, _) in variants.items():
            for n, p in ref.named_parameters():
                torch.testing.assert_close(params[n], p.detach(), msg=lambda m: f"rank {rank} {name} {n}: {m}")
            assert grad_none == [n for n, p in ref.named_parameters() if p.grad is None], f"{name}: .grad None as in one process"
    return per_rank


def test_every_wrapper_equals_single_process_training():
    per_rank = _assert_like_one_process("net", list(WRAPPERS))
    calls = {name: v[2] for name, v in per_rank[0].items()}
    assert calls["naive"] == calls["overlapped"] == 6, "one all-reduce per parameter tensor"
    assert calls["bucketed_25mb"] == 1, "everything fits in one 25 MB bucket"
    assert calls["bucketed_tiny"] > 1


def test_a_tied_weight_is_reduced_once_after_both_contributions():
    _assert_like_one_process("tied", list(WRAPPERS))


def test_unused_parameters_keep_no_gradient_as_in_one_process():
    # NaiveDDP zero-fills them (its documented trap): with weight decay it would differ
    _assert_like_one_process("unused", ["overlapped", "bucketed_25mb", "bucketed_tiny"])


def _used_on_rank_0_only(rank, world_size):
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x):
            return self.a(x) + (self.b(x) if rank == 0 else 0)

    model = Gate()
    ddp = BucketedDDP(model, bucket_size_mb=1e-5, find_unused_parameters=True)
    x = torch.ones(3, 4)
    ddp(x).sum().backward()
    return model.b.weight.grad, model.a.weight.grad


def test_a_parameter_used_on_one_rank_gets_the_average_on_every_rank():
    (b0, a0), (b1, a1) = launch(_used_on_rank_0_only, 2, echo=False)
    torch.testing.assert_close(b0, b1)  # rank 1 never used b, yet holds the same averaged gradient
    torch.testing.assert_close(b0, torch.full((2, 4), 3.0) / 2)  # (rank 0's 3 + rank 1's 0) / 2
    torch.testing.assert_close(a0, a1)


def _no_sync_then_sync(rank, world_size, wrapper):
    model = Net()
    ddp = WRAPPERS[wrapper](model, False)
    x, y = (t.chunk(world_size)[rank] for t in _data())
    with ddp.no_sync():
        nn.functional.cross_entropy(ddp(x), y).backward()
        assert ddp.finish() == 0
    nn.functional.cross_entropy(ddp(x), y).backward()
    return ddp.finish(), model.out.weight.grad


def test_no_sync_accumulates_then_one_sync_averages():
    for wrapper in ("overlapped", "bucketed_tiny"):
        (c0, g0), (c1, g1) = launch(_no_sync_then_sync, 2, args=(wrapper,), echo=False)
        assert c0 == c1 > 0
        torch.testing.assert_close(g0, g1)


def _unused_without_flag(rank, world_size):
    model = BucketedDDP(Net(with_unused=True))
    x, y = _data()
    nn.functional.cross_entropy(model(x), y).backward()  # the buckets are waited for at its end


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
