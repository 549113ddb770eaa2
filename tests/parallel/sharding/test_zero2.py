"""ZeRO2Optimizer trains exactly like torch's optimizer in one process on the full batch, holds the
optimizer state of its 1/N shard only, makes one reduce-scatter and one all-gather per step, pads a
parameter count that N does not divide, and refuses bad input with an error naming the fix.

One launch at 2 gloo ranks and one at 3 return everything the tests compare (cached per module).
"""

from __future__ import annotations

import functools
import math
import re

import pytest
import torch
from torch import nn

from gpulab.models import MLP
from gpulab.parallel import ZeRO2Optimizer, launch
from gpulab.parallel.sharding.accumulation import COUNTED, count_collectives
from gpulab.parallel.sharding.state_bytes import optimizer_state_bytes

from .test_zero1 import Tied  # the output layer reuses the input layer's weight: 180 elements

STEPS = 4


def _mlp():
    torch.manual_seed(0)
    return MLP([6, 20, 12, 5])  # 457 elements: neither 2 nor 3 divides it, so the last shard is padded


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(12, 6, generator=g), torch.randint(0, 5, (12,), generator=g)


CASES = {  # name: (model, optimizer class, options)
    "adamw": (_mlp, torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}),
    "adamw_tied": (Tied, torch.optim.AdamW, {"lr": 0.05}),
    "sgd_momentum": (_mlp, torch.optim.SGD, {"lr": 0.2, "momentum": 0.9}),
}


def _num_params(make):
    return sum(p.numel() for p in make().parameters())


def _rank_body(rank, world_size):
    inputs, targets = (t.chunk(world_size)[rank] for t in _data())  # this rank's share of the batch
    out = {}
    for name, (make, opt_cls, kwargs) in CASES.items():
        model = make()
        opt = ZeRO2Optimizer(model.parameters(), opt_cls, **kwargs)
        calls = []
        for _ in range(STEPS):
            with count_collectives() as counted:  # the whole iteration: no hook may communicate either
                opt.zero_grad()
                nn.functional.cross_entropy(model(inputs), targets).backward()
                opt.step()
            calls.append({k: counted[k] for k in COUNTED})
        out[name] = {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "calls": calls,
                     "state_bytes": optimizer_state_bytes(opt.local_optimizer), "shard": opt.shard.detach().clone(),
                     "grad_shard": opt.shard.grad.clone(), "local_params": sum(len(g["params"]) for g in opt.local_optimizer.param_groups)}
    errors = {}  # bad input inside a real process group: each raises before any collective
    frozen = _mlp()
    frozen.net[0].bias.requires_grad_(False)
    for what, build in {
        "frozen": lambda: ZeRO2Optimizer(frozen.parameters(), torch.optim.AdamW, lr=0.1),
        "empty": lambda: ZeRO2Optimizer([], torch.optim.AdamW, lr=0.1),
        "twice": lambda: ZeRO2Optimizer([frozen.net[0].weight] * 2, torch.optim.AdamW),
        "groups": lambda: ZeRO2Optimizer([{"params": list(_mlp().parameters())}], torch.optim.AdamW),
        "devices": lambda: ZeRO2Optimizer([nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3, device="meta"))],
                                          torch.optim.AdamW),
        "kwargs": lambda: ZeRO2Optimizer(_mlp().parameters(), torch.optim.SGD, lr=0.1, momentom=0.9),
    }.items():
        try:
            build()
        except (ValueError, TypeError) as err:
            errors[what] = f"{type(err).__name__}: {err}"
    out["errors"] = errors
    return out


@functools.lru_cache(maxsize=None)
def _ranks(world_size):
    return launch(_rank_body, world_size, timeout=120, echo=False)


def _single(make, opt_cls, **kwargs):
    """torch's own optimizer, one process, the whole batch."""
    model = make()
    opt = opt_cls(model.parameters(), **kwargs)
    inputs, targets = _data()
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_training_equals_torchs_optimizer_on_the_full_batch(case, world_size):
    make, opt_cls, kwargs = CASES[case]
    ref, _ = _single(make, opt_cls, **kwargs)
    for rank, out in enumerate(_ranks(world_size)):
        for n, p in ref.named_parameters():
            torch.testing.assert_close(out[case]["params"][n], p.detach(), rtol=0, atol=1e-5,
                                       msg=lambda m, n=n: f"rank {rank} of {world_size}, {case}, {n}: {m}")


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_rank_holds_its_shard_and_that_shards_state_only(world_size):
    numel = _num_params(_mlp)
    shard = math.ceil(numel / world_size)
    assert numel % world_size, "the case pads its last shard"
    ref, full = _single(_mlp, torch.optim.AdamW, lr=0.05, weight_decay=0.1)
    flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()] + [torch.zeros(shard * world_size - numel)])
    for rank, out in enumerate(_ranks(world_size)):
        got = out["adamw"]
        assert got["local_params"] == 1 and got["shard"].shape == (shard,)
        torch.testing.assert_close(got["shard"], flat[rank * shard:(rank + 1) * shard], rtol=0, atol=1e-5)
        # AdamW: exp_avg and exp_avg_sq of the shard (float32) and one float32 step counter
        assert got["state_bytes"] == 2 * 4 * shard + 4
        assert got["state_bytes"] <= optimizer_state_bytes(full) / world_size + 4, "about 1/N of full AdamW's state"
        assert out["sgd_momentum"]["state_bytes"] == 4 * shard, "one momentum buffer, for the shard"
        assert got["grad_shard"].shape == (shard,), "the averaged gradient is kept for the shard only"
    assert optimizer_state_bytes(full) == 2 * 4 * numel + 4 * len(list(ref.parameters()))


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_reduce_scatter_and_one_all_gather_per_step(world_size):
    expected = {k: 0 for k in COUNTED} | {"reduce_scatter_tensor": 1, "all_gather_into_tensor": 1}
    for out in _ranks(world_size):
        for case in CASES:
            assert out[case]["calls"] == [expected] * STEPS, case


def test_padding_stays_zero_and_out_of_the_model():
    out = _ranks(3)[2]  # the last rank's shard ends in the padding
    numel, shard = _num_params(_mlp), math.ceil(_num_params(_mlp) / 3)
    pad = 3 * shard - numel
    assert pad > 0
    assert torch.equal(out["adamw"]["shard"][-pad:], torch.zeros(pad)), "zero gradient and zero weight: it never moves"
    assert torch.equal(out["adamw"]["grad_shard"][-pad:], torch.zeros(pad))


@pytest.mark.parametrize("what, error, words", [
    ("frozen", "ValueError", "do not require grad.*p.requires_grad"),
    ("empty", "ValueError", "no parameters"),
    ("twice", "ValueError", "appears twice"),
    ("groups", "ValueError", "not param-group dicts"),
    ("devices", "ValueError", "span.*model.to"),
    ("kwargs", "TypeError", "could not build SGD.*momentom"),
])
def test_bad_input_names_the_fix(what, error, words):
    got = _ranks(2)[0]["errors"].get(what)
    assert got is not None, f"{what}: no error raised"
    assert got.startswith(error) and re.search(words, got), got


def test_no_process_group_names_the_launcher():
    with pytest.raises(RuntimeError, match="process group.*gpulab.parallel.launch"):
        ZeRO2Optimizer(_mlp().parameters(), torch.optim.AdamW, lr=0.1)
    with pytest.raises(TypeError, match="optimizer class"):
        ZeRO2Optimizer(_mlp().parameters(), "adamw")
