"""TensorParallelMLP against the single-process feed_forward block on 2 and 4 gloo ranks: the
output, the input's gradient and every parameter's gradient within 1e-5, one all-reduce forward
and one backward of the (tokens, h) activation, and 1/N of the weight bytes per rank."""

from __future__ import annotations

import pytest
import torch

from gpulab.parallel.tp import TensorParallelMLP, analytic_allreduces, feed_forward, runs
from gpulab.parallel.tp.memory import parameter_bytes

from .blocks import CASES, gpulab_run


@pytest.mark.parametrize("world_size", [2, 4])
def test_outputs_and_every_gradient_match_one_process(world_size):
    got = gpulab_run("mlp", world_size)
    expected = runs.expected_shards("mlp", CASES, 0, world_size)
    assert runs.max_abs_diff(got, expected) < 1e-5
    for rank in got:  # every gradient exists, named as the lab names them
        assert set(rank[0]["grads"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


@pytest.mark.parametrize("world_size", [2, 4])
def test_collectives_per_step_equal_the_analytic_count(world_size):
    for rank in gpulab_run("mlp", world_size):
        for (batch_size, seq_len), res in zip(CASES, rank):
            want = analytic_allreduces(batch_size * seq_len, runs.HIDDEN, "mlp")
            assert res["comm"] == {"all_reduce": want}, (batch_size, seq_len)
            assert want["calls"] == 2


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_holds_a_1_over_n_share_of_the_weights(world_size):
    full = feed_forward(runs.HIDDEN, runs.FFN)
    for rank in gpulab_run("mlp", world_size):
        assert rank[0]["weight_bytes"] * world_size == parameter_bytes(full, matrices_only=True)
        # the biases: fc1's is split, fc2's (added after the all-reduce) is whole on every rank
        assert rank[0]["param_bytes"] == (2 * runs.HIDDEN * runs.FFN + runs.FFN) * 4 // world_size + runs.HIDDEN * 4


def test_the_block_needs_a_hidden_size_divisible_by_the_ranks():
    with pytest.raises(ValueError, match="out_features=64 is not divisible by world_size=3"):
        TensorParallelMLP(feed_forward(16, 64), 0, 3)


def test_one_rank_is_the_full_block():
    """With world_size=1 there is nothing to split (and no process group is needed: f is the identity forward)."""
    full = feed_forward(8)
    tp = TensorParallelMLP(full, 0, 1)
    for p, q in zip(tp.parameters(), full.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
