"""Bytes per rank counted from the tensors each rank holds, against the analytic count: DDP, ZeRO-1
(gpulab's and torch's) and FSDP2 side by side in one 2-rank launch; the ZeRO paper's arithmetic."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from gpulab.parallel import launch
from gpulab.parallel.sharding.runs import (
    ShardingConfig,
    measure_sharding,
    preload_sharding,
    sharding_model,
    summarize_sharding,
)
from gpulab.parallel.sharding.state_bytes import (
    FP32_ADAM,
    MIXED_PRECISION_ADAM,
    bytes_per_parameter,
    optimizer_state_bytes,
    state_bytes,
    tensor_bytes,
)
from gpulab.parallel.sharding.zero1 import balanced_owners

CFG = ShardingConfig(width=32, depth=3, batch_size=8, num_steps=2, warmup=1, return_params=True)


@functools.lru_cache(maxsize=None)
def _runs():
    preload_sharding()
    return launch(measure_sharding, 2, args=(["ddp", "zero1", "torch_zero", "fsdp2"], CFG), timeout=120, echo=False)


def _single_process_params():
    model = sharding_model(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr)
    g = torch.Generator().manual_seed(CFG.seed + 1)
    for _ in range(CFG.warmup + CFG.num_steps):
        x, y = torch.randn(CFG.batch_size, CFG.width, generator=g), torch.randint(0, CFG.width, (CFG.batch_size,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return dict(model.named_parameters())


def test_every_strategy_trains_like_one_process():
    ref = _single_process_params()
    for rank, out in enumerate(_runs()):
        for name, run in out.items():
            for n, p in ref.items():
                torch.testing.assert_close(run["params"][n], p.detach(), msg=lambda m: f"rank {rank} {name} {n}: {m}")


def test_bytes_per_rank_are_exact():
    model = sharding_model(CFG)
    params = list(model.parameters())
    n, tensors = sum(p.numel() for p in params), len(params)
    owners = balanced_owners(params, 2)
    for rank, out in enumerate(_runs()):
        ddp, zero1, fsdp2 = out["ddp"]["bytes"], out["zero1"]["bytes"], out["fsdp2"]["bytes"]
        assert (ddp["params"], ddp["grads"]) == (4 * n, 4 * n), "DDP: full fp32 parameters and gradients"
        assert ddp["optimizer_state"] == 8 * n + 4 * tensors, "AdamW: exp_avg + exp_avg_sq, a float32 step per tensor"
        mine = [p for p, o in zip(params, owners) if o == rank]
        assert zero1["optimizer_state"] == sum(8 * p.numel() + 4 for p in mine)
        assert (zero1["params"], zero1["grads"]) == (4 * n, 4 * n), "ZeRO-1 keeps full parameters and gradients"
        assert out["torch_zero"]["bytes"]["optimizer_state"] == zero1["optimizer_state"], "same partition as torch's"
        # FSDP2: every tensor's rows split in two (width 32 is even); each rank keeps a step per tensor
        assert (fsdp2["params"], fsdp2["grads"]) == (2 * n, 2 * n)
        assert fsdp2["optimizer_state"] == 4 * n + 4 * tensors
        assert ddp["num_params"] == fsdp2["num_params"] == n, "DTensor.numel() is the global size"
        assert ddp["cuda_peak"] is None, "no CUDA peak on the CPU"


def test_summary_and_the_arithmetic_agree():
    s = summarize_sharding(_runs())
    n = s["ddp"]["num_params"]
    tensors = len(list(sharding_model(CFG).parameters()))  # 4 weights, 4 biases: even shares over 2 ranks
    steps = 4 * tensors  # AdamW's float32 step: per tensor, not per parameter (on each rank that updates it)
    assert s["ddp"]["max_bytes"]["total"] == bytes_per_parameter(2, 0, FP32_ADAM) * n + steps == 16 * n + steps
    assert s["zero1"]["max_bytes"]["total"] == bytes_per_parameter(2, 1, FP32_ADAM) * n + steps // 2 == 12 * n + steps // 2
    assert s["fsdp2"]["max_bytes"]["total"] == bytes_per_parameter(2, 3, FP32_ADAM) * n + steps == 8 * n + steps
    assert all(v["step_s"] > 0 for v in s.values())


def test_bytes_per_parameter_is_the_zero_paper_arithmetic():
    assert bytes_per_parameter(8, 0) == 16
    assert bytes_per_parameter(8, 1) == 4 + 12 / 8
    assert bytes_per_parameter(8, 2) == 2 + 14 / 8
    assert bytes_per_parameter(8, 3) == 16 / 8
    assert bytes_per_parameter(1, 3) == bytes_per_parameter(1, 0) == sum(MIXED_PRECISION_ADAM)
    with pytest.raises(ValueError, match="stage must be"):
        bytes_per_parameter(2, 4)
    with pytest.raises(ValueError, match="world_size"):
        bytes_per_parameter(0, 1)


def test_tied_weights_and_views_count_once():
    lin = nn.Linear(4, 3)
    assert tensor_bytes([lin.weight, lin.weight, lin.bias, None, 7]) == (12 + 3) * 4
    flat = torch.zeros(10)
    assert tensor_bytes([flat[:4], flat[4:]]) == 40, "two views of one buffer: both halves"
    model = nn.Sequential(lin, nn.ReLU(), lin)  # the same layer twice
    counted = state_bytes(model)
    assert (counted.params, counted.grads, counted.optimizer_state, counted.num_params) == (60, 0, 0, 15)


def test_optimizer_state_bytes_of_a_plain_optimizer():
    lin = nn.Linear(4, 3)
    opt = torch.optim.AdamW(lin.parameters())
    assert optimizer_state_bytes(opt) == 0, "no state before the first step"
    lin(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert optimizer_state_bytes(opt) == 2 * 15 * 4 + 2 * 4
    counted = state_bytes(lin, opt)
    assert counted.total == 60 + 60 + 128 and counted.per_parameter()["params"] == 4.0


@pytest.mark.gpu
def test_on_a_gpu_the_allocator_peak_is_reported_beside_the_exact_count():
    per_rank = launch(measure_sharding, 1, args=(["ddp", "zero1"], CFG), backend="nccl", timeout=300, echo=False)
    for name, run in per_rank[0].items():
        b = run["bytes"]
        assert b["cuda_peak"] is not None and b["cuda_peak"] >= b["total"], f"{name}: the peak holds at least the state"
        torch.testing.assert_close(run["params"]["net.0.weight"], _single_process_params()["net.0.weight"].detach(),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_on_a_gpu_each_strategys_peak_is_its_own():
    """Measured after DDP, ZeRO-1's CUDA peak held DDP's leftovers (a wrapper's hooks keep cycles to its
    model until a collection): it must equal ZeRO-1's peak measured alone."""
    after = launch(measure_sharding, 1, args=(["ddp", "zero1"], CFG), backend="nccl", timeout=300, echo=False)[0]
    alone = launch(measure_sharding, 1, args=(["zero1"], CFG), backend="nccl", timeout=300, echo=False)[0]
    peak_after, peak_alone = after["zero1"]["bytes"]["cuda_peak"], alone["zero1"]["bytes"]["cuda_peak"]
    assert abs(peak_after - peak_alone) <= 0.02 * peak_alone, (peak_after, peak_alone)
