"""TensorParallelAttention (heads split over ranks, q/k/v fused into one column-parallel layer)
against the single-process SelfAttention on 2 and 4 gloo ranks: outputs and gradients within
1e-5, two all-reduces per step, 1/N of the weights; fuse_qkv's row order."""

from __future__ import annotations

import pytest
import torch

from gpulab.parallel.tp import SelfAttention, analytic_allreduces, fuse_qkv, runs
from gpulab.parallel.tp.memory import parameter_bytes

from .blocks import CASES, gpulab_run


@pytest.mark.parametrize("world_size", [2, 4])
def test_outputs_and_every_gradient_match_one_process(world_size):
    got = gpulab_run("attention", world_size)
    assert runs.max_abs_diff(got, runs.expected_shards("attention", CASES, 0, world_size)) < 1e-5


@pytest.mark.parametrize("world_size", [2, 4])
def test_one_allreduce_forward_and_one_backward(world_size):
    for rank in gpulab_run("attention", world_size):
        for (batch_size, seq_len), res in zip(CASES, rank):
            assert res["comm"] == {"all_reduce": analytic_allreduces(batch_size * seq_len, runs.HIDDEN, "attention")}


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_holds_a_1_over_n_share_of_the_weights(world_size):
    full = SelfAttention(runs.HIDDEN, runs.HEADS)
    for rank in gpulab_run("attention", world_size):
        assert rank[0]["weight_bytes"] * world_size == parameter_bytes(full, matrices_only=True)


def test_fuse_qkv_gives_each_rank_its_heads_q_k_v():
    attn = SelfAttention(8, 4)
    fused = fuse_qkv(attn, 2)
    x = torch.randn(3, 8)
    for rank in range(2):
        mine = torch.nn.functional.linear(x, fused.weight.chunk(2)[rank], fused.bias.chunk(2)[rank])  # (3, 12)
        q, k, v = mine.chunk(3, -1)
        torch.testing.assert_close(q, attn.q(x).chunk(2, -1)[rank])
        torch.testing.assert_close(k, attn.k(x).chunk(2, -1)[rank])
        torch.testing.assert_close(v, attn.v(x).chunk(2, -1)[rank])
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by world_size=3"):
        fuse_qkv(attn, 3)
