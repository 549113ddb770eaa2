"""gpulab.parallel.ddp.rebuild against torch's own reducer: the bucket rule against
``torch.distributed._compute_bucket_assignment_by_size`` (the C++ function the reducer calls), and
the whole rebuild (ready order observed, then buckets) against the buckets torch DDP really used."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from gpulab.parallel import launch
from gpulab.parallel.ddp.rebuild import OutOfOrderNet, ready_order, rebuilt_buckets, torch_ddp_buckets


def _torch_rule(params, order, bucket_mb, first_mb):
    tensors = [params[i] for i in order]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [int(first_mb * 2**20), int(bucket_mb * 2**20)], [],
                                                         list(order))
    return [list(b) for b in buckets]


def test_rule_matches_torchs_bucket_assignment_on_random_sizes_and_orders():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 25)
        params = [torch.empty(rng.randint(1, 500_000), device="meta") for _ in range(n)]
        order = list(range(n))
        rng.shuffle(order)
        bucket_mb, first_mb = rng.choice([0.25, 1.0, 2.0, 25.0]), rng.choice([0.1, 1.0])
        assert rebuilt_buckets(params, order, bucket_mb, first_mb) == _torch_rule(params, order, bucket_mb, first_mb)


def test_a_bucket_closes_once_it_reaches_the_limit_and_may_pass_it():
    kib = 1 / 1024
    params = [torch.empty(256) for _ in range(3)] + [torch.empty(1024)]   # 1, 1, 1, 4 KiB of float32
    # first limit 2 KiB: 1 + 1 reaches it; then 1 + 4 = 5 KiB passes the 3 KiB limit by one tensor
    assert rebuilt_buckets(params, [0, 1, 2, 3], 3 * kib, 2 * kib) == [[0, 1], [2, 3]]
    assert rebuilt_buckets(params, [3, 2, 1, 0], 100, 2 * kib) == [[3], [2, 1, 0]]


def test_each_dtype_fills_its_own_buckets():
    params = [torch.empty(100_000), torch.empty(100_000, dtype=torch.float64), torch.empty(100_000)]  # 0.4, 0.8, 0.4 MB
    assert rebuilt_buckets(params, [0, 1, 2], 25, 1) == [[0, 2], [1]]   # the open buckets, in the order they opened
    assert sorted(rebuilt_buckets(params, [0, 1, 2], 25, 1)) == sorted(_torch_rule(params, [0, 1, 2], 25, 1))


def test_bad_orders_and_limits_are_refused():
    params = [torch.empty(4), torch.empty(4)]
    with pytest.raises(ValueError, match="exactly once"):
        rebuilt_buckets(params, [0, 0])
    with pytest.raises(ValueError, match="> 0"):
        rebuilt_buckets(params, [1, 0], 0)


def _net():
    torch.manual_seed(0)
    return OutOfOrderNet([32, 512, 512, 256, 10], [3, 0, 2, 1])


def test_ready_order_and_rebuild_match_the_buckets_torch_ddp_rebuilt():
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    model = _net()
    order = ready_order(model, x, y)
    reverse = list(reversed(range(len(list(model.parameters())))))
    assert order != reverse                                   # the model this exercise is about
    assert all(p.grad is None for p in model.parameters())    # probed on a copy
    torch_side = launch(torch_ddp_buckets, 2, args=(_net, x, y), echo=False)
    assert [r["initial_buckets"] for r in torch_side] == [1, 1]   # find_unused_parameters=False: one bucket first
    expected = rebuilt_buckets(list(model.parameters()), order)
    assert len(expected) > 1
    assert [r["rebuilt"] for r in torch_side] == [expected, expected]


def test_out_of_order_net_refuses_a_bad_order():
    with pytest.raises(ValueError, match="permutation"):
        OutOfOrderNet([4, 4, 4], [0, 0])


def _capped(rank, world_size, x, y):
    return torch_ddp_buckets(rank, world_size, _net, x, y, bucket_cap_mb=0.5)


def test_an_explicit_bucket_cap_also_caps_torchs_first_bucket():
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    model = _net()
    order = ready_order(model, x, y)
    torch_side = launch(_capped, 2, args=(x, y), echo=False)
    expected = rebuilt_buckets(list(model.parameters()), order, 0.5, 0.5)
    assert expected != rebuilt_buckets(list(model.parameters()), order, 0.5)   # the 1 MiB first bucket would differ
    assert torch_side[0]["rebuilt"] == expected


def _finding_unused(rank, world_size, x, y):
    return torch_ddp_buckets(rank, world_size, _net, x, y, find_unused_parameters=True)


def test_torch_never_rebuilds_when_it_looks_for_unused_parameters():
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    torch_side = launch(_finding_unused, 2, args=(x, y), echo=False)
    assert torch_side[0]["initial_buckets"] > 1 and torch_side[0]["rebuilt"] == []
