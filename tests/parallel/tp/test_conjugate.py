"""f and g (CopyToParallel, ReduceFromParallel) on 2 and 4 gloo ranks: each rank feeds its own
seeded tensor, and the forward values and gradients are compared with the sums computed here."""

from __future__ import annotations

import functools

import pytest
import torch

from gpulab.parallel import launch
from gpulab.parallel.tp import CollectiveCounter, copy_to_parallel, reduce_from_parallel


def _tensor(rank, salt):
    return torch.randn(3, 5, generator=torch.Generator().manual_seed(100 * salt + rank))


def _body(rank, world_size):
    out = {}
    for name, op in (("f", copy_to_parallel), ("g", reduce_from_parallel)):
        x = _tensor(rank, 1).requires_grad_()
        before = x.detach().clone()
        with CollectiveCounter() as comm:
            y = op(x)
            (y * _tensor(rank, 2)).sum().backward()  # a different upstream gradient on every rank
        out[name] = {"y": y.detach(), "grad": x.grad, "x_after": x.detach(), "x_before": before, "log": comm.log}
    return out


@functools.lru_cache(maxsize=None)
def _run(world_size):
    return launch(_body, world_size, timeout=120, echo=False)


@pytest.mark.parametrize("world_size", [2, 4])
def test_f_is_identity_forward_and_sums_gradients_backward(world_size):
    upstream_sum = sum(_tensor(r, 2) for r in range(world_size))
    for rank, out in enumerate(_run(world_size)):
        torch.testing.assert_close(out["f"]["y"], _tensor(rank, 1), rtol=0, atol=0)
        torch.testing.assert_close(out["f"]["grad"], upstream_sum, rtol=0, atol=1e-6)
        assert out["f"]["log"] == [("all_reduce", 3 * 5 * 4)], "one all-reduce, in backward only"


@pytest.mark.parametrize("world_size", [2, 4])
def test_g_sums_forward_and_passes_gradients_through(world_size):
    input_sum = sum(_tensor(r, 1) for r in range(world_size))
    for rank, out in enumerate(_run(world_size)):
        torch.testing.assert_close(out["g"]["y"], input_sum, rtol=0, atol=1e-6)
        torch.testing.assert_close(out["g"]["grad"], _tensor(rank, 2), rtol=0, atol=0)
        torch.testing.assert_close(out["g"]["x_after"], out["g"]["x_before"], rtol=0, atol=0,
                                   msg="g must not reduce into its input (autograd may have saved it)")
        assert out["g"]["log"] == [("all_reduce", 3 * 5 * 4)], "one all-reduce, in forward only"
