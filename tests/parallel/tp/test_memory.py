"""Bytes per rank counted from the tensors (weights, gradients, activations saved for backward)
equal the analytic count, at 1, 2 and 4 ranks."""

from __future__ import annotations

import functools

import pytest
import torch

from gpulab.parallel import launch
from gpulab.parallel.tp import TensorParallelMLP, feed_forward
from gpulab.parallel.tp.memory import analytic_mlp_bytes, parameter_bytes, saved_activation_bytes
from gpulab.parallel.tp.timing import measure_bytes

HIDDEN, FFN, TOKENS = 16, 64, 10


@functools.lru_cache(maxsize=None)
def _run(world_size):
    return launch(measure_bytes, world_size, args=(TensorParallelMLP, HIDDEN, FFN, TOKENS), timeout=120, echo=False)


@pytest.mark.parametrize("world_size", [2, 4])
def test_measured_bytes_equal_the_analytic_count(world_size):
    want = analytic_mlp_bytes(TOKENS, HIDDEN, FFN, world_size)
    for rank in _run(world_size):
        assert rank == want
    assert want["weights"] * world_size == analytic_mlp_bytes(TOKENS, HIDDEN, FFN, 1)["weights"]


def test_single_process_saved_activations():
    block = feed_forward(HIDDEN, FFN)
    x = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    _, saved = saved_activation_bytes(lambda: block(x), exclude=block)
    assert saved == analytic_mlp_bytes(TOKENS, HIDDEN, FFN, 1)["activations"]
    _, with_params = saved_activation_bytes(lambda: block(x))  # the linears save their weights too
    assert with_params == saved + parameter_bytes(block, matrices_only=True)
    with pytest.raises(ValueError, match="ffn=64 is not divisible by world_size=3"):
        analytic_mlp_bytes(TOKENS, HIDDEN, FFN, 3)
