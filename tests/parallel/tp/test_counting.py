"""CollectiveCounter sees torch.distributed's collectives and DTensor's functional ones, with
their logical bytes; analytic_allreduces is Megatron's count."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from gpulab.parallel import launch
from gpulab.parallel.tp import CollectiveCounter, analytic_allreduces
from gpulab.parallel.tp.counting import _classify


def _body(rank, world_size):
    x = torch.ones(4, 3)  # 48 bytes
    all_reduce = dist.all_reduce  # imported by another name: still counted (the dispatcher sees it)
    with CollectiveCounter() as comm:
        all_reduce(x)
        dist.all_gather([torch.empty(4, 3) for _ in range(world_size)], x)
        dist.reduce_scatter(torch.empty(2, 3), list(torch.ones(4, 3).chunk(2)))
        dist.broadcast(x, 0)
        funcol.all_reduce(x, "sum", list(range(world_size))).wait()
        funcol.all_gather_tensor(x, 0, list(range(world_size))).wait()
    return comm.log, comm.summary()


@functools.lru_cache(maxsize=None)
def _run():
    return launch(_body, 2, timeout=120, echo=False)


def test_every_collective_is_counted_once_with_its_full_size():
    log, summary = _run()[0]
    assert log == [("all_reduce", 48), ("all_gather", 96), ("reduce_scatter", 48), ("broadcast", 48),
                   ("all_reduce", 48), ("all_gather", 96)]
    assert summary["all_reduce"] == {"calls": 2, "bytes": 96}


def test_plain_ops_are_not_collectives():
    assert _classify("aten.mm.default", (torch.ones(1),)) is None
    assert _classify("_c10d_functional.wait_tensor.default", (torch.ones(1),)) is None
    with CollectiveCounter() as comm:  # no process group needed when nothing is communicated
        torch.ones(3) @ torch.ones(3)
    assert comm.summary() == {}


def test_analytic_count():
    assert analytic_allreduces(10, 16) == {"calls": 2, "bytes": 2 * 10 * 16 * 4}
    assert analytic_allreduces(10, 16, "attention", element_size=2) == {"calls": 2, "bytes": 2 * 10 * 16 * 2}
    assert analytic_allreduces(10, 16, "mlp", input_requires_grad=False)["calls"] == 1
    assert analytic_allreduces(10, 16, "transformer")["calls"] == 4
    assert analytic_allreduces(10, 16, "transformer", input_requires_grad=False)["calls"] == 3
    with pytest.raises(ValueError, match="block='conv' is not one of"):
        analytic_allreduces(10, 16, "conv")
