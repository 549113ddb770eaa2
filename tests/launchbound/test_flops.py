"""gpulab.launchbound.flops: the analytic count of a transformer block equals FlopCounterMode's, forward and
training (3x), and the 6·N·tokens rule misses exactly attention's products."""

from __future__ import annotations

import pytest
import torch

from gpulab.launchbound.flops import TransformerBlock, count_flops, matmul_params, six_n_tokens, transformer_block_flops


@pytest.mark.parametrize("shape", [(2, 16, 64, 4, 256), (1, 7, 48, 3, 80), (3, 32, 32, 1, 128)])
def test_the_analytic_count_is_what_flop_counter_mode_counts(shape) -> None:
    B, T, d, h, d_ff = shape
    torch.manual_seed(0)
    block, x = TransformerBlock(d, h, d_ff), torch.randn(B, T, d)
    assert count_flops(block, x).total == transformer_block_flops(B, T, d, h, d_ff)
    assert count_flops(block, x, backward=True).total == 3 * transformer_block_flops(B, T, d, h, d_ff)


def test_heads_do_not_change_the_count() -> None:
    assert transformer_block_flops(2, 16, 64, 1, 256) == transformer_block_flops(2, 16, 64, 8, 256)


def test_six_n_tokens_misses_only_attention_products() -> None:
    B, T, d, h, d_ff = 2, 16, 64, 4, 256
    block = TransformerBlock(d, h, d_ff)
    training = count_flops(block, torch.randn(B, T, d), backward=True).total
    rule = six_n_tokens(matmul_params(block), B * T)
    assert training - rule == 3 * B * 2 * (2 * T * T * d)  # Q Kᵀ and A V, forward and backward


def test_count_flops_names_the_products() -> None:
    count = count_flops(torch.nn.Linear(8, 4), torch.randn(5, 8))
    assert count.total == 2 * 5 * 8 * 4 and count.by_op == {"addmm": 320}


def test_heads_must_divide_the_width() -> None:
    with pytest.raises(ValueError, match="multiple of n_heads"):
        TransformerBlock(30, 4, 64)
