"""ColumnParallelLinear and RowParallelLinear built from a full nn.Linear compute its output and
its gradients, each rank holding 1/N of the weight (2 and 4 gloo ranks, uneven batch sizes)."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from gpulab.parallel import launch
from gpulab.parallel.tp import ColumnParallelLinear, RowParallelLinear
from gpulab.parallel.tp.layers import shard_size

IN, OUT = 12, 8
BATCHES = (3, 7)  # neither divides by 2 or 4: TP splits features, never the batch


def _linear():
    torch.manual_seed(0)
    return nn.Linear(IN, OUT)


def _data(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, IN, generator=g), torch.randn(batch_size, OUT, generator=g)


def _single(batch_size):
    lin = _linear()
    x, dy = _data(batch_size)
    x.requires_grad_()
    y = lin(x)
    (y * dy).sum().backward()
    return y.detach(), x.grad, lin.weight.grad, lin.bias.grad


def _body(rank, world_size):
    out = {}
    for b in BATCHES:
        x, dy = _data(b)
        col = ColumnParallelLinear.from_linear(_linear(), rank, world_size)
        xc = x.clone().requires_grad_()
        y = col(xc)  # (B, OUT/N)
        (y * dy.chunk(world_size, -1)[rank]).sum().backward()
        gathered = ColumnParallelLinear.from_linear(_linear(), rank, world_size, gather_output=True)(x)
        row = RowParallelLinear.from_linear(_linear(), rank, world_size)
        xr = x.chunk(world_size, -1)[rank].clone().requires_grad_()  # this rank's input features
        z = row(xr)  # (B, OUT), every rank
        (z * dy).sum().backward()
        out[b] = {"col_y": y.detach(), "col_dx": xc.grad, "col_dw": col.weight.grad, "col_db": col.bias.grad,
                  "gathered": gathered.detach(), "row_y": z.detach(), "row_dx": xr.grad, "row_dw": row.weight.grad,
                  "row_db": row.bias.grad, "col_bytes": col.weight.numel() * 4, "row_bytes": row.weight.numel() * 4}
    try:
        row(torch.zeros(2, IN))  # the full input instead of this rank's slice
    except ValueError as err:
        out["wrong_input"] = str(err)
    return out


@functools.lru_cache(maxsize=None)
def _run(world_size):
    return launch(_body, world_size, timeout=120, echo=False)


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("batch_size", BATCHES)
def test_column_parallel_equals_the_full_linear(world_size, batch_size):
    y, dx, dw, db = _single(batch_size)
    for rank, out in enumerate(_run(world_size)):
        r = out[batch_size]
        _close(r["col_y"], y.chunk(world_size, -1)[rank], f"rank {rank} output slice")
        _close(r["col_dx"], dx, f"rank {rank} input gradient (all-reduced by f)")
        _close(r["col_dw"], dw.chunk(world_size, 0)[rank], f"rank {rank} weight rows' gradient")
        _close(r["col_db"], db.chunk(world_size, 0)[rank], f"rank {rank} bias slice's gradient")
        _close(r["gathered"], y, f"rank {rank} gather_output=True")
        assert r["col_bytes"] * world_size == IN * OUT * 4


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("batch_size", BATCHES)
def test_row_parallel_equals_the_full_linear(world_size, batch_size):
    y, dx, dw, db = _single(batch_size)
    for rank, out in enumerate(_run(world_size)):
        r = out[batch_size]
        _close(r["row_y"], y, f"rank {rank} output (all-reduced by g, bias added once)")
        _close(r["row_dx"], dx.chunk(world_size, -1)[rank], f"rank {rank} input slice's gradient")
        _close(r["row_dw"], dw.chunk(world_size, 1)[rank], f"rank {rank} weight columns' gradient")
        _close(r["row_db"], db, f"rank {rank} replicated bias gradient")
        assert r["row_bytes"] * world_size == IN * OUT * 4


def test_row_parallel_names_the_fix_for_a_full_input():
    message = _run(2)[0]["wrong_input"]
    assert "expects this rank's 6 of 12 input features, got 12" in message


def test_shard_size_refuses_an_uneven_split():
    assert shard_size(12, 4) == 3
    with pytest.raises(ValueError, match="out_features=10 is not divisible by world_size=4; use a multiple of 4 \\(e.g. 12\\)"):
        ColumnParallelLinear(4, 10, rank=0, world_size=4)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        shard_size(4, 0)
