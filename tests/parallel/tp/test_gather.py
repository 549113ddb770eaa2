"""gpulab.parallel.tp.gather's three pairs on 2 and 4 gloo ranks: each rank feeds its own seeded
piece and upstream gradient, and the values and gradients are compared with the concatenations and
sums computed here in one process; a dimension that does not split evenly is refused by name."""

from __future__ import annotations

import functools

import pytest
import torch

from gpulab.parallel import launch
from gpulab.parallel.tp.gather import gather_from_parallel, gather_from_sequence, reduce_scatter_to_sequence

SHAPE = (2, 4, 3)  # (batch, sequence, features): each rank's piece before a gather


def _tensor(rank, salt, shape=SHAPE):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(100 * salt + rank))


def _body(rank, world_size):
    n = world_size
    out = {}
    cases = (("parallel", gather_from_parallel, -1, SHAPE, (2, 4, 3 * n)),
             ("sequence", gather_from_sequence, 1, SHAPE, (2, 4 * n, 3)),
             ("scatter", reduce_scatter_to_sequence, 1, (2, 4 * n, 3), SHAPE))
    for name, op, dim, shape, out_shape in cases:
        x = _tensor(rank, 1, shape).requires_grad_()
        y = op(x, dim)
        (y * _tensor(rank, 2, out_shape)).sum().backward()  # a different upstream gradient on every rank
        out[name] = {"y": y.detach(), "grad": x.grad}
    try:
        reduce_scatter_to_sequence(_tensor(rank, 3, (2, 3, 3)), 1)  # 3 positions on 2 ranks
        out["uneven"] = None
    except ValueError as err:
        out["uneven"] = str(err)
    return out


@functools.lru_cache(maxsize=None)
def _run(world_size):
    return launch(_body, world_size, timeout=120, echo=False)


@pytest.mark.parametrize("world_size", [2, 4])
def test_gather_from_parallel_concatenates_and_keeps_its_own_gradient_slice(world_size):
    whole = torch.cat([_tensor(r, 1) for r in range(world_size)], dim=-1)
    for rank, out in enumerate(_run(world_size)):
        torch.testing.assert_close(out["parallel"]["y"], whole, rtol=0, atol=0)
        upstream = _tensor(rank, 2, (2, 4, 3 * world_size))  # this rank's own upstream gradient, nobody else's
        torch.testing.assert_close(out["parallel"]["grad"], upstream.chunk(world_size, dim=-1)[rank], rtol=0, atol=0)


@pytest.mark.parametrize("world_size", [2, 4])
def test_gather_from_sequence_reduce_scatters_the_gradient(world_size):
    whole = torch.cat([_tensor(r, 1) for r in range(world_size)], dim=1)
    summed = sum(_tensor(r, 2, (2, 4 * world_size, 3)) for r in range(world_size))  # partial sums on every rank
    for rank, out in enumerate(_run(world_size)):
        torch.testing.assert_close(out["sequence"]["y"], whole, rtol=0, atol=0)
        torch.testing.assert_close(out["sequence"]["grad"], summed.chunk(world_size, dim=1)[rank], rtol=0, atol=1e-6)


@pytest.mark.parametrize("world_size", [2, 4])
def test_reduce_scatter_to_sequence_sums_a_slice_and_gathers_the_gradient(world_size):
    summed = sum(_tensor(r, 1, (2, 4 * world_size, 3)) for r in range(world_size))
    for rank, out in enumerate(_run(world_size)):
        torch.testing.assert_close(out["scatter"]["y"], summed.chunk(world_size, dim=1)[rank], rtol=0, atol=1e-6)
        gathered = torch.cat([_tensor(r, 2) for r in range(world_size)], dim=1)
        torch.testing.assert_close(out["scatter"]["grad"], gathered, rtol=0, atol=0)


def test_an_uneven_split_is_refused_by_name():
    for out in _run(2):
        assert out["uneven"] is not None and "not divisible by 2 ranks" in out["uneven"]
