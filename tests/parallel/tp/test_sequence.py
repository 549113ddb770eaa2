"""Sequence parallelism on 2 and 4 gloo ranks: LayerNorm + MLP with the sequence split equals the
single-process block on each rank's tokens (gradients too, once the replicated ones are summed),
with one all-gather and one reduce-scatter each way instead of two all-reduces."""

from __future__ import annotations

import functools

import pytest
import torch

from gpulab.parallel import launch
from gpulab.parallel.tp import CollectiveCounter
from gpulab.parallel.tp.sequence import (
    SequenceParallelMLP,
    norm_feed_forward,
    run_sequence_parallel,
    sync_replicated_grads,
)

B, T, H = 3, 8, 16


def _data():
    g = torch.Generator().manual_seed(5)
    return torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)


def _body(rank, world_size):
    x, dy = _data()
    sp = SequenceParallelMLP(norm_feed_forward(H), rank, world_size)
    mine = x.chunk(world_size, 1)[rank].clone().requires_grad_()  # (B, T/N, H)
    with CollectiveCounter() as comm:
        y = sp(mine)
        (y * dy.chunk(world_size, 1)[rank]).sum().backward()
    sync_replicated_grads(sp)
    return {"y": y.detach(), "dx": mine.grad, "grads": {n: p.grad for n, p in sp.named_parameters()}, "log": comm.log}


@functools.lru_cache(maxsize=None)
def _run(world_size):
    return launch(_body, world_size, timeout=120, echo=False)


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_equals_one_process(world_size):
    full = norm_feed_forward(H)
    x, dy = _data()
    x.requires_grad_()
    y = full(x)
    (y * dy).sum().backward()
    want = {"norm.weight": full[0].weight.grad, "norm.bias": full[0].bias.grad, "b2": full[3].bias.grad}
    for rank, out in enumerate(_run(world_size)):
        torch.testing.assert_close(out["y"], y.detach().chunk(world_size, 1)[rank], rtol=0, atol=1e-5)
        torch.testing.assert_close(out["dx"], x.grad.chunk(world_size, 1)[rank], rtol=0, atol=1e-5)
        torch.testing.assert_close(out["grads"]["w1"], full[1].weight.grad.chunk(world_size, 0)[rank], rtol=0, atol=1e-5)
        torch.testing.assert_close(out["grads"]["w2"], full[3].weight.grad.chunk(world_size, 1)[rank], rtol=0, atol=1e-5)
        for name, grad in want.items():
            torch.testing.assert_close(out["grads"][name], grad, rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("world_size", [2, 4])
def test_gather_and_reduce_scatter_replace_the_allreduces(world_size):
    full_bytes = B * T * H * 4
    for out in _run(world_size):
        # forward: all-gather in, reduce-scatter out; backward: the conjugates, in reverse order
        assert out["log"] == [("all_gather", full_bytes), ("reduce_scatter", full_bytes),
                              ("all_gather", full_bytes), ("reduce_scatter", full_bytes)]


def test_the_rank_body_the_lab_runs():
    for out in launch(run_sequence_parallel, 2, timeout=120, echo=False):
        assert out["max_abs_diff"] < 1e-5
        assert [kind for kind, _ in out["log"]] == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
        assert out["norm_activation_bytes"] == 3 * 8 * 16 * 4 // 2
