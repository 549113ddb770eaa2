"""gpulab.parallel.sharding.fsdp: the reference wrapping trains like one process on 2 gloo ranks, stores
half of the bytes, and the probe counts the all-gathers and the bytes held whole that torch really makes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gpulab.parallel import RankFailedError, launch
from gpulab.parallel.sharding.accumulation import C10dOps
from gpulab.parallel.sharding.fsdp import (
    ADAM_EPS,
    BlockMLP,
    apply_fsdp,
    local_param_bytes,
    probe_fsdp,
    probe_wrappings,
    root_only,
)


def _single_process(num_steps: int = 2) -> dict[str, torch.Tensor]:
    """probe_fsdp's default data and optimizer, in one process on the whole batch."""
    model = BlockMLP()
    g = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(16, 8, generator=g), torch.randint(0, 8, (16,), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, eps=ADAM_EPS)
    for _ in range(num_steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def test_local_param_bytes_of_a_plain_module_is_the_whole_model():
    model = BlockMLP(width=16, depth=3)
    assert local_param_bytes(model) == 4 * sum(p.numel() for p in model.parameters()) == 4 * (
        8 * 16 + 16 + 3 * (16 * 32 + 32 + 32 * 16 + 16) + 16 * 8 + 8)


def test_per_block_and_root_only_on_two_ranks():
    runs = launch(probe_wrappings, 2, args=({"per block": apply_fsdp, "root only": root_only}, BlockMLP), echo=False)
    single = _single_process()
    for name in ("per block", "root only"):
        for r in runs:
            rec = r[name]
            assert rec["local_bytes"] * 2 == rec["full_bytes"], "16 rows split 8 / 8: half of the bytes on each rank"
            for n, p in single.items():
                torch.testing.assert_close(rec["params"][n], p, atol=1e-5, rtol=0)
    block, whole = runs[0]["per block"], runs[0]["root only"]
    assert block["units"] == ["", "blocks.0", "blocks.1", "blocks.2"] and whole["units"] == [""]
    assert block["gathers"] == [(4, 3)] * 2 and whole["gathers"] == [(1, 0)] * 2
    assert {b for *_, b in whole["timeline"]} == {whole["full_bytes"]}, "root only: the whole model, the whole step"
    assert max(b for *_, b in block["timeline"]) < whole["full_bytes"] / 2
    layers = [name for _, name, _ in block["timeline"]]
    assert layers[:2] == ["embed", "blocks.0.0"] and layers[-1] == "embed" and len(layers) == 2 * 8


def _gathers_rank(rank, world_size):
    with C10dOps() as counted:
        out = torch.empty(world_size * 3)
        dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
        dist.all_gather([torch.empty(2) for _ in range(world_size)], torch.ones(2))
        dist.all_reduce(torch.ones(2))
    return counted.all_gathers, counted.count, out.tolist()


def test_the_dispatcher_counter_tells_all_gathers_from_other_collectives():
    runs = launch(_gathers_rank, 2, echo=False)
    assert runs[0] == (2, 3, [0.0] * 3 + [1.0] * 3) == runs[1], "two all-gathers of three collectives"


def test_probe_reports_a_failing_wrapping_from_the_rank():
    def broken(model, mesh):
        raise ValueError("no blocks here")

    with pytest.raises(RankFailedError) as info:
        launch(probe_fsdp, 2, args=(broken, BlockMLP), echo=False)
    assert info.value.exc_type == "ValueError"
