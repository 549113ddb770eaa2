"""ShardedOptimizer (ZeRO-1) trains exactly like one process on the full batch, holds only its share
of the optimizer state, and checkpoints the full state; no_sync accumulation on NaiveDDP/BucketedDDP.

Multi-rank checks run in two launches (2 gloo ranks, then 3 ranks on a 2-tensor model) that
return everything the tests compare; the launches are cached per module so each starts once.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gpulab.models import MLP
from gpulab.parallel import BucketedDDP, NaiveDDP, ShardedOptimizer, allreduce_gradients, bucket_assignment, launch
from gpulab.parallel.sharding.accumulation import accumulation_step, count_collectives, torch_ddp_allreduce_calls
from gpulab.parallel.sharding.state_bytes import optimizer_state_bytes
from gpulab.parallel.sharding.zero1 import balanced_owners

STEPS = 3
BUCKET_MB = 200 * 4 / 2**20  # 200 floats: the 6 gradients make 3 buckets


class Tied(nn.Module):
    """The output layer reuses the input layer's weight: one parameter, two uses."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(6, 10)
        self.mid = nn.Linear(10, 10)

    def forward(self, x):
        return torch.tanh(self.mid(torch.tanh(self.inp(x)))) @ self.inp.weight


def _mlp():
    torch.manual_seed(0)
    return MLP([6, 20, 12, 6])  # uneven tensors: 120, 20, 240, 12, 72, 6 elements


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(12, 6, generator=g), torch.randint(0, 6, (12,), generator=g)


def _train(model, opt, inputs, targets, steps=STEPS, sync=None):
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        if sync is not None:
            sync(model)
        opt.step()


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _single(make_model, opt_cls, steps=STEPS, **kwargs):
    model = make_model()
    opt = opt_cls(model.parameters(), **kwargs)
    _train(model, opt, *_data(), steps=steps)
    return model, opt


CASES = {  # name: (model, optimizer class, options, ShardedOptimizer options)
    "sgd_momentum": (_mlp, torch.optim.SGD, {"lr": 0.2, "momentum": 0.9}, {}),
    "adamw": (_mlp, torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}, {}),
    "adamw_tied": (Tied, torch.optim.AdamW, {"lr": 0.05}, {}),
    "adamw_per_tensor": (_mlp, torch.optim.AdamW, {"lr": 0.05}, {"bucketed": False}),
}


def _sync(model):
    allreduce_gradients(model, dist.get_world_size())


def _two_rank_body(rank, world_size):
    inputs, targets = (t.chunk(world_size)[rank] for t in _data())  # this rank's half
    out = {}
    for name, (make, opt_cls, kwargs, extra) in CASES.items():
        model = make()
        opt = ShardedOptimizer(model.parameters(), opt_cls, **extra, **kwargs)
        with count_collectives() as calls:
            _train(model, opt, inputs, targets, sync=_sync)
        out[name] = {"params": _params(model), "state_bytes": optimizer_state_bytes(opt),
                     "owned": [i for i, p in enumerate(model.parameters()) if opt.owner[p] == rank],
                     "broadcasts": calls["broadcast"] / STEPS}
    # torch's ZeroRedundancyOptimizer on the same model: the same partition, the same bytes
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = _mlp()
    zro = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.05)
    _train(model, zro, inputs, targets, sync=_sync)
    out["torch_zero_state_bytes"] = optimizer_state_bytes(zro)
    # state_dict round trip: gather, then scatter from rank 0 into a fresh optimizer, and train on
    model = _mlp()
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.05, weight_decay=0.1)
    _train(model, opt, inputs, targets, sync=_sync)
    full = opt.state_dict()
    fresh = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1.0)
    fresh.load_state_dict(full if rank == 0 else None, src=0)
    _train(model, fresh, inputs, targets, steps=2, sync=_sync)
    out["state_dict"] = full
    out["after_reload"] = _params(model)
    # add_param_group: a second group with its own learning rate
    model = _mlp()
    params = list(model.parameters())
    opt = ShardedOptimizer(params[:2], torch.optim.SGD, lr=0.2, momentum=0.9)
    opt.add_param_group({"params": params[2:], "lr": 0.05})
    _train(model, opt, inputs, targets, sync=_sync)
    out["two_groups"] = _params(model)
    opt.zero_grad()
    out["grads_after_zero_grad"] = [p.grad for p in params]
    # no_sync accumulation: k micro-batches, one all-reduce round, same parameters as one big step
    micro = list(zip(inputs.chunk(3), targets.chunk(3)))
    for name, wrap in (("naive", NaiveDDP), ("bucketed", lambda m: BucketedDDP(m, bucket_size_mb=BUCKET_MB))):
        results = {}
        for use_no_sync in (True, False):
            ddp = wrap(_mlp())
            opt = torch.optim.SGD(ddp.module.parameters(), lr=0.2, momentum=0.9)
            with count_collectives() as calls:
                for _ in range(2):
                    if use_no_sync:
                        accumulation_step(ddp, opt, micro, nn.functional.cross_entropy)
                    else:
                        for x, y in micro:
                            (nn.functional.cross_entropy(ddp(x), y) / 3).backward()
                            ddp.sync_gradients()
                        opt.step()
                        opt.zero_grad()
            results[use_no_sync] = (calls["all_reduce"], _params(ddp.module))
        out[name] = results
    # the last micro-batch inside no_sync too: nothing is averaged, the ranks drift apart
    ddp = NaiveDDP(_mlp())
    opt = torch.optim.SGD(ddp.module.parameters(), lr=0.2)
    with ddp.no_sync():
        for x, y in micro:
            (nn.functional.cross_entropy(ddp(x), y) / 3).backward()
            assert ddp.sync_gradients() == 0, "inside no_sync, sync_gradients does nothing"
    opt.step()
    out["drifted"] = _params(ddp.module)
    # a class that is not an optimizer over params, but with a process group
    try:
        ShardedOptimizer(_mlp().parameters(), torch.optim.SGD, lr=0.1, momentom=0.9)
    except TypeError as err:
        out["bad_kwargs"] = str(err)
    return out


def _three_rank_body(rank, world_size):
    torch.manual_seed(0)
    model = MLP([6, 6])  # 2 parameter tensors over 3 ranks: rank 2 owns nothing
    inputs, targets = (t.chunk(world_size)[rank] for t in _data())
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.05)
    _train(model, opt, inputs, targets, sync=_sync)
    return {"params": _params(model), "state_bytes": optimizer_state_bytes(opt), "owned": len(opt.owned()),
            "state_dict": opt.state_dict()}


@functools.lru_cache(maxsize=None)
def _two():
    return launch(_two_rank_body, 2, timeout=120, echo=False)


@functools.lru_cache(maxsize=None)
def _three():
    return launch(_three_rank_body, 3, timeout=120, echo=False)


def _assert_params(got, ref, what):
    for n, p in ref.items():
        torch.testing.assert_close(got[n], p, msg=lambda m: f"{what} {n}: {m}")


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_training_equals_single_process(case):
    make, opt_cls, kwargs, _ = CASES[case]
    ref, _ = _single(make, opt_cls, **kwargs)
    for rank, out in enumerate(_two()):
        _assert_params(out[case]["params"], _params(ref), f"rank {rank} {case}")


def test_each_rank_holds_exactly_its_share_of_the_state():
    per_rank = _two()
    sizes = [p.numel() * 4 for p in _mlp().parameters()]
    owners = balanced_owners(list(_mlp().parameters()), 2)
    for rank, out in enumerate(per_rank):
        mine = [i for i, o in enumerate(owners) if o == rank]
        assert out["adamw"]["owned"] == mine, "ownership follows balanced_owners"
        # AdamW: exp_avg + exp_avg_sq (2 x the parameter) and a float32 scalar step per owned tensor
        assert out["adamw"]["state_bytes"] == sum(2 * sizes[i] + 4 for i in mine)
        assert out["sgd_momentum"]["state_bytes"] == sum(sizes[i] for i in mine), "one momentum buffer each"
        assert out["adamw"]["state_bytes"] == out["torch_zero_state_bytes"], "the same partition as torch's ZeRO"
    _, full = _single(_mlp, torch.optim.AdamW, lr=0.05)
    assert sum(o["adamw"]["state_bytes"] for o in per_rank) == optimizer_state_bytes(full), "the shares add up"
    assert max(o["adamw"]["state_bytes"] for o in per_rank) < 0.6 * optimizer_state_bytes(full), "balanced by size"


def test_broadcast_is_one_call_per_rank_when_bucketed_and_one_per_tensor_otherwise():
    out = _two()[0]
    assert out["adamw"]["broadcasts"] == 2
    assert out["adamw_per_tensor"]["broadcasts"] == 6


def test_more_ranks_than_parameter_tensors():
    per_rank = _three()
    torch.manual_seed(0)
    ref = MLP([6, 6])
    opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    _train(ref, opt, *_data())
    assert [o["owned"] for o in per_rank] == [1, 1, 0]
    assert per_rank[2]["state_bytes"] == 0
    for rank, out in enumerate(per_rank):
        _assert_params(out["params"], _params(ref), f"rank {rank}")
    assert per_rank[0]["state_dict"]["state"].keys() == {0, 1}


def test_state_dict_gathers_the_single_process_state_and_reloads_it():
    _, single = _single(_mlp, torch.optim.AdamW, lr=0.05, weight_decay=0.1)
    expected = single.state_dict()
    for out in _two():
        got = out["state_dict"]
        assert got["state"].keys() == expected["state"].keys()
        for i, s in expected["state"].items():
            for k, v in s.items():
                torch.testing.assert_close(got["state"][i][k], v, msg=lambda m: f"state[{i}][{k}]: {m}")
        assert got["param_groups"] == expected["param_groups"]
    # reloaded (lr=0.05 restored over the fresh optimizer's lr=1.0) and trained 2 more steps
    model, opt = _single(_mlp, torch.optim.AdamW, lr=0.05, weight_decay=0.1)
    _train(model, opt, *_data(), steps=2)
    for out in _two():
        _assert_params(out["after_reload"], _params(model), "after reload")


def test_add_param_group_and_zero_grad():
    model = _mlp()
    params = list(model.parameters())
    opt = torch.optim.SGD(params[:2], lr=0.2, momentum=0.9)
    opt.add_param_group({"params": params[2:], "lr": 0.05})
    _train(model, opt, *_data())
    for out in _two():
        _assert_params(out["two_groups"], _params(model), "two groups")
        assert all(g is None for g in out["grads_after_zero_grad"])


@pytest.mark.parametrize("wrapper", ["naive", "bucketed"])
def test_no_sync_accumulation_makes_k_times_fewer_all_reduces_and_equals_one_big_step(wrapper):
    model, opt = _single(_mlp, torch.optim.SGD, steps=2, lr=0.2, momentum=0.9)
    for out in _two():
        (with_calls, with_params), (without_calls, without_params) = out[wrapper][True], out[wrapper][False]
        assert without_calls == 3 * with_calls > 0, f"3 micro-batches: {without_calls} vs {with_calls} all-reduces"
        _assert_params(with_params, _params(model), f"{wrapper} with no_sync")
        _assert_params(without_params, _params(model), f"{wrapper} without no_sync")
    per_sync = 6 if wrapper == "naive" else len(bucket_assignment(list(_mlp().parameters()), BUCKET_MB))
    assert _two()[0][wrapper][True][0] == 2 * per_sync


def test_last_micro_batch_inside_no_sync_lets_ranks_drift():
    a, b = (out["drifted"] for out in _two())
    assert max((a[n] - b[n]).abs().max().item() for n in a) > 1e-3


def test_clear_errors():
    with pytest.raises(RuntimeError, match="process group.*launch"):
        ShardedOptimizer(_mlp().parameters(), torch.optim.AdamW, lr=0.1)
    with pytest.raises(TypeError, match="takes no parameters"):
        ShardedOptimizer(_mlp().parameters(), lambda: None)
    with pytest.raises(TypeError, match="not an instance|got an instance"):
        ShardedOptimizer(_mlp().parameters(), torch.optim.SGD(_mlp().parameters(), lr=0.1))
    with pytest.raises(TypeError, match="optimizer class"):
        ShardedOptimizer(_mlp().parameters(), "adamw")
    assert "momentom" in _two()[0]["bad_kwargs"] and "could not build SGD" in _two()[0]["bad_kwargs"]


def test_balanced_owners_is_largest_first():
    params = [torch.zeros(n) for n in (10, 40, 30, 20, 10)]
    # largest first to the lighter rank: 40 -> 0, 30 -> 1, 20 -> 1 (30 < 40), 10 -> 0 (40 < 50), 10 -> 0 (a tie: lowest)
    assert balanced_owners(params, 2) == [0, 0, 1, 1, 0]
    assert balanced_owners(params, 1) == [0] * 5
    assert balanced_owners(params, 7) == [3, 0, 1, 2, 4]
    with pytest.raises(ValueError, match="world_size"):
        balanced_owners(params, 0)


def test_torch_ddp_no_sync_seen_by_the_profiler():
    per_rank = launch(torch_ddp_allreduce_calls, 2, args=(3,), echo=False)
    assert per_rank == [{"no_sync": 1, "every_micro_batch": 3}] * 2


def test_accumulation_step_needs_micro_batches():
    with pytest.raises(ValueError, match="micro_batches is empty"):
        accumulation_step(NaiveDDP, None, [], nn.functional.cross_entropy)


def test_count_collectives_restores_torch_distributed():
    original = dist.all_reduce
    with count_collectives() as calls:
        assert dist.all_reduce is not original
    assert dist.all_reduce is original and calls["all_reduce"] == 0
